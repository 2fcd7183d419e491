"""``make bench``: toolq side by side with bare Celery, raw Redis and in-process calls."""
