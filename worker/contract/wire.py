"""The wire contract between orchestrator and workers, defined once: JSON only.

Everything that crosses between the two floors is here: the pools and the task name, a call and
its answer, the conversation state a call carries, a tool as the fleet serves it, a worker's
heartbeat, why a call failed, the Redis keys both sides read and write, and the rule a
workspace-relative glob follows, which callers check before they send one.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated, Any, Literal

from kombu import Queue
from pydantic import BaseModel, ConfigDict, Field

from worker.contract.errors import ErrorKind
from worker.contract.network import NetworkValue
from worker.contract.run_limits import RunLimits

#: The worker pools: ``tools`` for file, search, session and plugin tools; ``sandbox`` for
#: commands (run_bash), kept on workers of their own.
Pool = Literal["tools", "sandbox"]
POOLS: tuple[Pool, ...] = ("tools", "sandbox")

#: The queue of whole conversations, served by agents workers (``api/agents/``), which run the
#: orchestrator's code and send their tool calls to the pools above. Not a tool pool: no tool is
#: served there, and no tool worker takes from it.
AGENTS_QUEUE: Literal["agents"] = "agents"
#: What a live worker serves, as its heartbeat says: tool pools, or the agents queue.
Served = Literal[Pool, "agents"]


def task_queues(*names: Served) -> list[Queue]:
    """The queues ``names`` as every Celery app of toolq declares them, a worker's and a
    producer's alike: a RabbitMQ queue declared twice must be declared the same way."""
    return [Queue(name, routing_key=name) for name in names]


#: The one Celery task a tool call is.
TASK_NAME = "toolq.execute_tool"

#: What bounds a call's memory where no control group does: each of its processes alone.
PER_PROCESS_MEMORY = "rlimit (address space, per process only)"
#: The isolation layer a worker reports when each run's commands run as a uid and gid of their
#: own (``worker.sandbox.identity``): what ``toolq status`` calls "runs apart".
LAYER_RUN_UID = "run-uid"

RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
#: A message's id on the wire, which is also its Celery task id: a call's, or a conversation's.
TaskId = Annotated[str, Field(min_length=1, max_length=256)]

#: A message of the conversation, as the chat API has it.
Message = dict[str, Any]


class ToolContextSnapshot(BaseModel):
    """The agent state tools may read, at one moment: what travels with a tool call."""

    system_prompt: str = ""
    session_context: list[Message] = Field(default_factory=list)
    session_context_file_path: str = "session_context.json"


class ToolSpec(BaseModel):
    """One tool as the fleet serves it: what workers publish and callers build proxies from."""

    name: str
    description: str
    parameters: dict[str, Any]
    pool: Pool
    enabled_by_default: bool
    idempotent: bool
    default_timeout_ms: int
    timeout_argument: str | None = None
    #: Registration order on the worker, so every caller lists tools the same way.
    position: int = 0
    #: False for a service operation (files in and out, commands with input): callers use it,
    #: models never see it.
    for_model: bool = True
    #: False: the tool never reads the conversation, and its calls carry none
    #: (``ToolCallRequest.context`` empty). A spec without it (an older worker's) reads it.
    reads_context: bool = True

    def schema_for_model(self) -> dict[str, Any]:
        """The tool as the chat API's ``tools`` list takes it."""
        return function_tool(self.name, self.description, self.parameters)


def function_tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI ``{"type": "function", ...}`` envelope of one tool."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


class SandboxLimits(BaseModel):
    """What a sandbox worker applies to each run_bash command, and what enforces each limit."""

    isolation: list[str] = Field(description="The layers every command gets.")
    memory_mb: int
    memory_by: str = Field(
        description="cgroup v2, cgroup v1 (the call's processes together), or "
        f"{PER_PROCESS_MEMORY!r} (each process alone)."
    )
    max_processes: int
    processes_by: str = Field(description="cgroup v2, cgroup v1, or rlimit (per user).")
    cpu_accounting_by: str = Field(description="cgroup v2, cgroup v1, or rusage.")
    cpu: float | None = Field(None, description="The CPUs a command may use; null: no limit.")
    cpu_limit_by: str = Field(
        "none",
        description="What holds a CPU limit (the worker's, or a run's ``limits.cpu``): cgroup v2, "
        "cgroup v1, or none, with why (a command then runs without one; its usage's "
        "limits.cpu is null).",
    )
    file_size_mb: int
    problem: str | None = Field(None, description="Why commands cannot run, if they cannot.")


class WorkerLimits(BaseModel):
    """The limits a worker applies to the runs it serves."""

    workspace_quota_bytes: int = Field(description="0: no quota.")
    workspace_quota_by: str = Field(
        description="How the quota holds: a file system per run, accounting, or none."
    )
    workspace_ttl_s: int = Field(description="A workspace no call touched this long is removed.")
    sandbox: SandboxLimits | None = Field(None, description="Only on sandbox workers.")


class WorkerInfo(BaseModel):
    """A live worker, as its heartbeat says."""

    worker: str = Field(description="Celery's node name, e.g. tools@host.")
    pools: list[Served]
    host: str
    pid: int
    started: float = Field(description="Epoch seconds.")
    unavailable: dict[str, str] = Field(
        default_factory=dict,
        description="Tools it was set up to serve and cannot (an MCP server's as <server>__*), "
        "and why.",
    )
    beat_at: float | None = Field(None, description="Epoch seconds of the last heartbeat.")
    limits: WorkerLimits | None = None


class ResourceUsage(BaseModel):
    """What a command and everything it started used (run_bash); null where the worker's
    machine cannot measure it (no control group does that job there)."""

    cpu_ms: int | None = Field(None, description="CPU time, user and system, of every process.")
    max_rss_kb: int | None = Field(None, description="The most memory held at once.")
    pids_peak: int | None = Field(None, description="The most processes at once.")
    killed_processes: int | None = Field(
        None, description="Processes still running at the end (or the timeout), killed."
    )
    oom_killed: bool = Field(False, description="The memory limit stopped a process.")
    limits: RunLimits | None = Field(
        None,
        description="The limits the command ran under: the run's where it asked (``limits``), "
        "else the worker's defaults; cpu null: no CPU limit held.",
    )
    network_allowed: int | None = Field(
        None, description="Connections the run's network let through (null: no network)."
    )
    network_refused: int | None = Field(
        None, description="Connections the run's network refused (null: no network)."
    )


class ToolCallRequest(BaseModel):
    """One tool call, as the orchestrator sends it."""

    model_config = ConfigDict(extra="forbid")

    task_id: TaskId = Field(
        description="The call's id on the wire, also its Celery task id: unique per attempt."
    )
    tool_call_id: str | None = Field(
        None, max_length=256, description="The model's id for the call, for logs."
    )
    run_id: str = Field(pattern=RUN_ID_PATTERN, description="Names the run's workspace folder.")
    tool: str = Field(min_length=1, max_length=256)
    arguments: str | dict[str, Any] = Field(description="As the model sent them: raw JSON or dict.")
    context: ToolContextSnapshot = Field(default_factory=ToolContextSnapshot)
    timeout_ms: int = Field(gt=0, description="The tool's own deadline, already clamped.")
    deadline: float = Field(description="Epoch seconds after which nobody waits for the answer.")
    reply_to: str | None = Field(None, description="Redis list that receives the result.")
    environment: str | None = Field(
        None,
        max_length=128,
        description="The run's container (a run with an image), which the call runs in; the "
        "worker that holds it answers environment_lost when it is gone. None: no image.",
    )
    network: NetworkValue = Field(
        "none",
        description='The run\'s network: "none" (loopback alone), "full", or the destinations '
        "(host:port, CIDR:port) its commands may reach through the worker's proxy.",
    )
    limits: RunLimits | None = Field(
        None,
        description="The run's own limits for its commands (time, memory, processes, CPU), "
        "within the fleet's maximums (``TOOLQ_LIMITS_MAX_*``); None: the worker's defaults.",
    )
    send_number: int = Field(
        1,
        ge=1,
        description="Which message of the call this is: 1, then one more each time the caller "
        "sends again a call that no worker started. A message that finds the call started by "
        "another neither runs nor answers it.",
    )


class ToolCallResult(BaseModel):
    """The answer to one tool call."""

    model_config = ConfigDict(extra="forbid")

    task_id: str
    tool: str
    output: str = Field(description="Text for the model, capped at the output limit.")
    is_error: bool = False
    error_kind: ErrorKind | None = None
    duration_ms: float = 0.0
    truncated: bool = False
    worker: str | None = Field(None, description="hostname:pid of the process that ran it.")
    usage: ResourceUsage | None = Field(None, description="What a command used (run_bash).")
    holder: str | None = Field(
        None,
        description="The queue of the sandbox worker that holds the run's shell sessions "
        "(bash_session): the run's next sandbox calls go there, as an image run's go to its "
        "container's worker.",
    )
    seal: str | None = Field(
        None,
        description="HMAC-SHA256 of the rest of the answer under the call's own key, derived "
        "from the fleet secret and the call's task_id (``FleetSecret.seal_key``): proof that a "
        "worker of the fleet wrote this answer to this call. The key is in no message.",
    )
    sealer: str | None = Field(
        None,
        description="Which fleet secret sealed it (``FleetSecret.secret_id``, which tells "
        "nothing of it): a caller whose workers read another one says so.",
    )

    def sealed_with(self, key: str | None, sealer: str | None = None) -> ToolCallResult:
        """This answer sealed with ``key`` (the call's ``FleetSecret.seal_key``) by the secret
        named ``sealer``; as it is when ``key`` is None."""
        if key is None:
            return self
        named = self.model_copy(update={"sealer": sealer})
        return named.model_copy(update={"seal": named._mac(key)})

    def is_sealed_with(self, key: str) -> bool:
        """Whether a worker that had ``key`` wrote this very answer."""
        return self.seal is not None and hmac.compare_digest(self.seal, self._mac(key))

    def _mac(self, key: str) -> str:
        # The answer as it travels, less the seal: any change to it breaks the seal.
        content = self.model_dump_json(exclude={"seal"}).encode()
        return hmac.new(key.encode(), content, hashlib.sha256).hexdigest()

    @classmethod
    def failure(
        cls, request: ToolCallRequest, kind: ErrorKind, message: str, worker: str | None = None
    ) -> ToolCallResult:
        """The answer to ``request`` when it failed for ``kind``; ``message`` is for the model."""
        return cls(
            task_id=request.task_id,
            tool=request.tool,
            output=message,
            is_error=True,
            error_kind=kind,
            worker=worker,
        )


class StreamsCut(BaseModel):
    """Which of a command's output streams were cut at their cap."""

    stdout: bool = False
    stderr: bool = False


class CommandAnswer(BaseModel):
    """What a command did: run_bash's answer (its JSON text), and ``toolq.exec``'s."""

    stdout: str
    stderr: str = Field(description="With a notice of how the command ended, when not by itself.")
    exit_code: int = Field(description="-1 after a timeout; 128+N when killed by signal N.")
    timed_out: bool
    duration_ms: int
    truncated: StreamsCut = Field(default_factory=StreamsCut)
    isolation: list[str] = Field(default_factory=list, description="The layers it ran under.")
    usage: ResourceUsage | None = Field(None, description="Resources used, where measured.")


#: The ``send_number`` of the start marker a caller sets for a call it stopped waiting for.
CALLER_GAVE_UP = 0


def start_mark(send_number: int, starter: str, node: str | None = None) -> str:
    """A start marker's value: which message of the call started it, and who did: the process,
    and the worker it is part of (its Celery node name), whose heartbeat tells whether it
    lives."""
    return f"{send_number} {starter}" + (f" {node}" if node else "")


def read_start_mark(value: bytes | str) -> tuple[int, str]:
    """``(send_number, starter)`` of a start marker; a bare name is the first message's."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    number, _, rest = text.partition(" ")
    if number.isdigit() and rest:
        return int(number), rest.split(" ", 1)[0]
    return 1, text


def start_mark_node(value: bytes | str) -> str | None:
    """The worker (Celery node name) a start marker names; None where it names none (a
    caller's mark, or a worker's from before marks named it)."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    parts = text.split(" ")
    return parts[2] if len(parts) == 3 and parts[0].isdigit() and parts[2] else None


def glob_segments(pattern: str) -> tuple[str, ...]:
    """The segments of a workspace-relative glob such as ``src/**/*.py``.

    The rule search_files and ``toolq.collect_files`` match by, shared so that a caller can
    refuse a pattern before it sends it. ``ValueError`` says what is wrong, as words that follow
    "the pattern ...": a glob may only match below where it starts.
    """
    if "\x00" in pattern:
        raise ValueError("contains a NUL byte")
    if pattern.startswith("/"):
        raise ValueError("is absolute; patterns are relative, e.g. '**/*.py'")
    segments = tuple(s for s in pattern.split("/") if s not in ("", "."))
    if ".." in segments:
        raise ValueError("contains '..'; a pattern may only match below where it starts")
    if not segments:
        raise ValueError("names no files; try '**/*'")
    return segments
