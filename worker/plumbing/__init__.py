"""What both floors' processes run the same way, standing on the contract: sending a job,
storing its answer once and replying (``jobs``), a worker's heartbeat and lifeline, the Redis
transport's fixes and a store that refuses for a while, a message's checks before Celery reads
it (``celery_guard``), retries with growing pauses, and the log context.

Kept out of ``worker.contract``, which holds only what the two sides agree on (data, names,
rules), and out of the workers' own machinery, since the orchestrator runs it too: ``api`` may
import it (``tests/test_layers.py``). It imports nothing of toolq's but the contract.
"""
