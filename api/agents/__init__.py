"""The agents pool: whole conversations as Celery tasks on the ``agents`` queue.

``toolq worker --pool agents`` (``celery -A api.agents.app worker -Q agents``) runs them, each
worker process holding many at once on one event loop (``host.py``); ``toolq batch --on-fleet``
and the HTTP API send them (``client.py``). The messages and keys are in ``messages.py``; the
rules that keep a conversation to one run at a time and one answer, in ``store.py``.
"""
