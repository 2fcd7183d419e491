"""Every Redis key toolq reads and writes, named once: the fleet's (calls, answers, heartbeats,
the manifest), the agents pool's conversations, kombu's where toolq reads or sets them, and the
HTTP API's state. A key's string is a contract: workers and callers of other versions share it."""

from __future__ import annotations


class RedisKeys:
    """The keys of the fleet's calls: what workers and callers share about each call and each
    worker."""

    PREFIX = "toolq"
    #: Hash of tool name -> ToolSpec JSON, written by workers with every heartbeat.
    MANIFEST = f"{PREFIX}:manifest"
    REPLY_PREFIX = f"{PREFIX}:reply:"

    @staticmethod
    def result(task_id: str) -> str:
        """The one stored answer to a call: first write wins."""
        return f"{RedisKeys.PREFIX}:result:{task_id}"

    @staticmethod
    def started(task_id: str) -> str:
        """Set when a worker begins a call (``start_mark``): a second delivery finds it and knows
        the first was cut. Set by the caller when it stops waiting for a call never started,
        which then never starts."""
        return f"{RedisKeys.PREFIX}:started:{task_id}"

    @staticmethod
    def reply(dispatcher_id: str) -> str:
        """A caller's inbox: workers push answers here, one reader drains it."""
        return f"{RedisKeys.REPLY_PREFIX}{dispatcher_id}"

    @staticmethod
    def is_reply(key: str) -> bool:
        return key.startswith(RedisKeys.REPLY_PREFIX)

    @staticmethod
    def worker_heartbeat(pool: str, worker: str) -> str:
        """A live worker's WorkerInfo, expiring unless refreshed."""
        return f"{RedisKeys.PREFIX}:worker:{pool}:{worker}"

    @staticmethod
    def node_claim(worker: str) -> str:
        """A sandbox worker's claim on its node name as it starts, before its first heartbeat:
        the WorkerInfo of the process that took it."""
        return f"{RedisKeys.PREFIX}:node-claim:{worker}"

    @staticmethod
    def worker_heartbeats(pool: str) -> str:
        """Pattern matching every live worker of a pool."""
        return f"{RedisKeys.PREFIX}:worker:{pool}:*"


keys = RedisKeys()


# --- The agents pool: a conversation sent to the ``agents`` queue -------------------------------


class ConversationKeys:
    """The Redis keys of one conversation on the agents queue (``api/agents/store.py``)."""

    PREFIX = f"{RedisKeys.PREFIX}:conversation"

    @staticmethod
    def result(conversation_id: str) -> str:
        """The answer, stored once, until the caller has taken it."""
        return f"{ConversationKeys.PREFIX}:{conversation_id}:result"

    @staticmethod
    def lease(conversation_id: str) -> str:
        """``<attempt> <worker>`` while an agents worker runs the conversation."""
        return f"{ConversationKeys.PREFIX}:{conversation_id}:lease"

    @staticmethod
    def attempts(conversation_id: str) -> str:
        """How many runs of the conversation have started since it was sent."""
        return f"{ConversationKeys.PREFIX}:{conversation_id}:attempts"

    @staticmethod
    def current(conversation_id: str) -> str:
        """The task id of the send that may run, or ``written`` once the caller has the answer:
        a message of any other send is dropped."""
        return f"{ConversationKeys.PREFIX}:{conversation_id}:current"


conversation_keys = ConversationKeys()


# --- The broker's own, where it is Redis: kombu's names, which toolq reads and sets ------------

#: Where kombu's Redis transport keeps delivered, unacknowledged messages of the tool pools.
UNACKED_HASH = "unacked"
#: The same for the agents queue, with its index and mutex, kept apart: the tool pools' shorter
#: visibility timeout would put a conversation that still runs back in its queue.
AGENTS_UNACKED_HASH = f"{RedisKeys.PREFIX}:agents:unacked"
AGENTS_UNACKED_INDEX = f"{AGENTS_UNACKED_HASH}_index"
AGENTS_UNACKED_MUTEX = f"{AGENTS_UNACKED_HASH}_mutex"
#: What kombu puts between a queue's name and a priority step to name that step's list.
PRIORITY_SEP = "\x06\x16"
#: The priority steps kombu keeps a list for, besides the queue's own (0).
PRIORITY_STEPS = (3, 6, 9)


def queue_lists(queue: str) -> list[str]:
    """The lists kombu keeps a queue's waiting messages in: its name, then one per priority."""
    return [queue, *(f"{queue}{PRIORITY_SEP}{step}" for step in PRIORITY_STEPS)]


# --- The HTTP API's state: runs, batches, replicas (``api/state/``) -----------------------------
#
# A run is a hash and a stream of its events, a batch a hash, a list of its output records and a
# list of their summaries, a replica a lease that expires unless renewed; sorted sets list each
# tenant's runs and batches by age.

API_PREFIX = f"{RedisKeys.PREFIX}:api"
#: Where a cancel request is published, for the replica that executes the run.
CANCEL_CHANNEL = f"{API_PREFIX}:cancel"
#: Sets of the runs and batches not yet ended, which the reaper looks through.
ACTIVE_RUNS = f"{API_PREFIX}:active:runs"
ACTIVE_BATCHES = f"{API_PREFIX}:active:batches"
#: Sorted sets of the default tenant's runs and batches by creation time, newest last: what the
#: viewer lists (another tenant's are ``runs_index_key``'s and ``batches_index_key``'s).
RUNS_INDEX = f"{API_PREFIX}:index:runs"
BATCHES_INDEX = f"{API_PREFIX}:index:batches"
#: The tenant of a server with one token or none. Its indexes are the ones every run and batch
#: was in before tenants, and records written before tenants are its own.
DEFAULT_TENANT = "default"


def run_state_key(run_id: str) -> str:
    """The hash of a run's status, prompt, options, answer and transcript."""
    return f"{API_PREFIX}:run:{run_id}"


def run_events_key(run_id: str) -> str:
    """The stream of a run's events."""
    return f"{run_state_key(run_id)}:events"


def run_cancel_key(run_id: str) -> str:
    """Set when someone asked to cancel a run, for a replica that missed the message."""
    return f"{run_state_key(run_id)}:cancel"


def batch_state_key(batch_id: str) -> str:
    """The hash of a batch's status and progress counts."""
    return f"{API_PREFIX}:batch:{batch_id}"


def batch_results_key(batch_id: str) -> str:
    """The list of a batch's output records (``BatchRecord`` lines), in the order they
    finished."""
    return f"{batch_state_key(batch_id)}:results"


def batch_summaries_key(batch_id: str) -> str:
    """The list of a batch's item summaries, beside its results: what the viewer filters."""
    return f"{batch_state_key(batch_id)}:summaries"


def runs_index_key(tenant: str) -> str:
    """The index of one tenant's runs."""
    return RUNS_INDEX if tenant == DEFAULT_TENANT else f"{RUNS_INDEX}:{tenant}"


def batches_index_key(tenant: str) -> str:
    """The index of one tenant's batches."""
    return BATCHES_INDEX if tenant == DEFAULT_TENANT else f"{BATCHES_INDEX}:{tenant}"


def replica_lease_key(replica: str) -> str:
    """An API replica's lease: while it exists, the replica looks after its work."""
    return f"{API_PREFIX}:replica:{replica}"


def tenant_holdings_key(kind: str, tenant: str) -> str:
    """The sorted set of what one tenant holds of a capped ``kind`` (live runs, MCP sessions),
    each member scored by when its holder's lease ends."""
    return f"{API_PREFIX}:holding:{kind}:{tenant}"


# --- Inspect's evals using toolq sandboxes (``api/inspect_sandbox/owners.py``) ------------------

#: An eval's lease while it runs: whose sandboxes ``inspect sandbox cleanup toolq`` keeps.
INSPECT_EVAL_PREFIX = f"{RedisKeys.PREFIX}:inspect:eval:"


def inspect_eval_key(owner: str) -> str:
    """The lease of the eval known as ``owner``."""
    return f"{INSPECT_EVAL_PREFIX}{owner}"
