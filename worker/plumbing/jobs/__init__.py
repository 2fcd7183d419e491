"""Send a job, store its answer once, reply: one mechanism for tool calls and conversations.

- ``answers``: the runner's side. The first answer stored is the job's; a run of it that ends
  later gets that one back instead, and the answer goes to the caller's reply list in the same
  round trip. Each kind of job keeps key strings of its own.
- ``replies``: the caller's side. One reply list per caller, drained by one reader, each answer
  handed to whoever waits for its job.
- ``delivery``: how a job's Celery message is delivered (``JobTask``, the base of both tasks):
  at least once, its answer kept by ``answers`` rather than Celery's result backend.
"""
