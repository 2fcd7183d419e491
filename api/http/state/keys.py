"""Where the API keeps its state in Redis, and the statuses every kind of work shares.

Every key is under ``toolq:api:``: a run is a hash and a stream of its events, a batch a hash, a
list of its output records and a list of their summaries, a replica a lease that expires unless
renewed; sorted sets list each tenant's runs and batches by age. A record's ``tenant`` field
names whose it is.
"""

from __future__ import annotations

PREFIX = "toolq:api"
#: Where a cancel request is published, for the replica that executes the run.
CANCEL_CHANNEL = f"{PREFIX}:cancel"
#: Sets of the runs and batches not yet ended, which the reaper looks through.
ACTIVE_RUNS = f"{PREFIX}:active:runs"
ACTIVE_BATCHES = f"{PREFIX}:active:batches"
#: Sorted sets of the default tenant's runs and batches by creation time, newest last: what the
#: viewer lists (another tenant's are ``runs_index_key``'s and ``batches_index_key``'s).
RUNS_INDEX = f"{PREFIX}:index:runs"
BATCHES_INDEX = f"{PREFIX}:index:batches"
#: How many runs and batches each index keeps; older ones drop out of the lists.
INDEX_SIZE = 10_000
#: The tenant of a server with one token or none; records written before tenants are its own.
DEFAULT_TENANT = "default"

#: The statuses of work not yet ended, runs and batches alike.
ACTIVE: tuple[str, ...] = ("queued", "running")
#: The type of the event that ends a run's stream.
DONE = "done"


def run_state_key(run_id: str) -> str:
    """The hash of a run's status, prompt, options, answer and transcript."""
    return f"{PREFIX}:run:{run_id}"


def run_events_key(run_id: str) -> str:
    """The stream of a run's events."""
    return f"{run_state_key(run_id)}:events"


def run_cancel_key(run_id: str) -> str:
    """Set when someone asked to cancel a run, for a replica that missed the message."""
    return f"{run_state_key(run_id)}:cancel"


def batch_state_key(batch_id: str) -> str:
    """The hash of a batch's status and progress counts."""
    return f"{PREFIX}:batch:{batch_id}"


def batch_results_key(batch_id: str) -> str:
    """The list of a batch's output records, in the order they finished."""
    return f"{batch_state_key(batch_id)}:results"


def batch_summaries_key(batch_id: str) -> str:
    """The list of a batch's item summaries, beside its results: what the viewer filters."""
    return f"{batch_state_key(batch_id)}:summaries"


def runs_index_key(tenant: str) -> str:
    """The index of one tenant's runs; the default tenant's is the one every run was in before
    tenants, so its lists still show them."""
    return RUNS_INDEX if tenant == DEFAULT_TENANT else f"{RUNS_INDEX}:{tenant}"


def batches_index_key(tenant: str) -> str:
    """The index of one tenant's batches (the default tenant's: as for runs)."""
    return BATCHES_INDEX if tenant == DEFAULT_TENANT else f"{BATCHES_INDEX}:{tenant}"


def replica_lease_key(replica: str) -> str:
    """An API replica's lease: while it exists, the replica looks after its work."""
    return f"{PREFIX}:replica:{replica}"
