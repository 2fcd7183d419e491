"""The statuses every kind of work the API keeps shares, runs and batches alike (their keys are
``worker.contract.keys``'s)."""

from __future__ import annotations

#: The statuses of work not yet ended.
ACTIVE: tuple[str, ...] = ("queued", "running")
#: The type of the event that ends a run's stream.
DONE = "done"
