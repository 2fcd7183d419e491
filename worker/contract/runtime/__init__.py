"""What both floors' Celery apps run the same way: a worker's heartbeat and lifeline, the Redis
transport's fixes, a request's checks, retries with growing pauses, and the log context."""
