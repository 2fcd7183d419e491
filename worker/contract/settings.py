"""Settings read from ``TOOLQ_*`` environment variables: what the whole fleet shares, and what
only workers need. The orchestrator's own settings are in ``api.settings``."""

from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from worker.contract.image_sources import ImageSources
from worker.contract.limits import DEFAULT_OUTPUT_CAP_BYTES, DEFAULT_TRANSFER_MAX_BYTES
from worker.contract.mcp_servers import load_servers
from worker.contract.network import NETWORK_ALLOWED_VARIABLE, NetworkAllowance
from worker.contract.run_limits import LimitsMax
from worker.contract.sandbox_settings import SandboxSettings

LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"
ENV_PREFIX = "TOOLQ_"

#: URL schemes of the brokers toolq works with: its queue depths, heartbeats and delivery
#: settings are written for Redis' and RabbitMQ's transports, not for kombu's others.
BROKER_SCHEMES = ("redis", "rediss", "amqp", "amqps")
#: Results, replies, manifests and API state are Redis data structures.
RESULT_SCHEMES = ("redis", "rediss")

#: The orchestrator's own settings (``api.settings.OrchestratorSettings``), which workers do not
#: read but must accept: a local stack's workers, and those sharing a deployment's .env, are
#: started with the orchestrator's environment. A test keeps this list equal to the class.
ORCHESTRATOR_ONLY_FIELDS = (
    "model",
    "llm_timeout_s",
    "llm_max_retries",
    "max_turns",
    "api_token",
    "api_tokens_file",
    "api_max_body_bytes",
    "task_files_max_bytes",
    "conversation_timeout_s",
    "agent_concurrency",
    "tenant_max_runs",
    "tenant_max_mcp_sessions",
    "tenant_network_allowed",
    "tenant_limits_max",
)
#: ``TOOLQ_`` variables that are not settings: the traceback switch for errors, and the marker
#: run_bash puts in each command's environment (``worker.sandbox.config.MARKER_VARIABLE``).
DEBUG_VARIABLE = "TOOLQ_DEBUG"
OTHER_VARIABLES = (DEBUG_VARIABLE, "TOOLQ_SANDBOX_ID")


class FleetSettings(BaseSettings):
    """What workers and callers must agree on: where the broker is, deadlines, the output cap.

    A misspelt field is an error, not a default (``extra="forbid"``).
    """

    # A nested model's fields are variables of their own: TOOLQ_SANDBOX_MEMORY_MB is
    # ``sandbox.memory_mb`` (split once, after the field's name).
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        frozen=True,
        env_nested_delimiter="_",
        env_nested_max_split=1,
    )

    broker_url: str | None = Field(
        None, description="Celery broker (redis:// or amqp://). Unset: toolq starts a local stack."
    )
    result_backend: str | None = Field(
        None, description="Redis URL for results; defaults to the broker URL when that is Redis."
    )
    default_timeout_ms: int = Field(
        30_000, gt=0, description="A call's deadline when neither the call nor its tool sets one."
    )
    max_timeout_ms: int = Field(600_000, gt=0, description="The largest deadline a call may ask.")
    hard_limit_grace_s: float = Field(
        5.0, gt=0, description="Seconds past the soft limit before the worker child is replaced."
    )
    reply_margin_s: float = Field(
        10.0, gt=0, description="Seconds past a call's deadline before the caller gives up."
    )
    resend_after_s: float = Field(
        5.0,
        gt=0,
        description="A call no worker has started this long after it was sent, while its "
        "pool's queue is empty, is sent again (its message was lost); each message sent again "
        "and lost in turn is followed by another, after a pause that doubles up to 4 times "
        "this, while its deadline leaves at least this long.",
    )
    output_cap_bytes: int = Field(
        DEFAULT_OUTPUT_CAP_BYTES, gt=0, description="Cap on every tool's answer (50 KB)."
    )
    limits_max: LimitsMax = Field(
        default_factory=LimitsMax,
        description="The most a run may ask for its commands (`limits`): TOOLQ_LIMITS_MAX_<FIELD>; "
        "a run asking more is refused before anything runs.",
    )
    result_ttl_s: int = Field(86_400, gt=0, description="How long results are kept.")
    fleet_secret_file: Path | None = Field(
        None,
        description="A file (0600, 0400 or 0440, at least 32 bytes) holding the secret every "
        "worker and caller of the fleet shares, which seals each answer to its call; it is "
        "never in a message. Unset: a file made once under ~/.local/state/toolq, shared by one "
        "user's processes on one host: a fleet on several hosts must set it.",
    )
    log_format: Literal["auto", "json", "text"] = Field("auto", description="auto: JSON off a TTY.")
    log_level: str = Field("INFO", description="Python logging level.")
    image_sources: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated sources a run's image may come from: registries "
        "(a host, with its :port or a /path below it: ghcr.io/acme, 10.0.0.5:5000, docker.io) "
        "and folders of the sandbox worker "
        "(oci:/srv/images, oci-archive:/..., docker-archive:/...). Unset: any, except that "
        "with TOOLQ_API_TOKENS_FILE a token's run takes no host path and no loopback, private "
        "or link-local address it does not name.",
    )

    @model_validator(mode="before")
    @classmethod
    def _nested_by_variable_name(cls, data: Any) -> Any:
        # A nested model's field given by its variable's name (sandbox_memory_mb=...), as the
        # environment names it, is that field of the model (``sandbox.memory_mb``).
        if not isinstance(data, dict):
            return data
        for name, field in cls.model_fields.items():
            nested = field.annotation
            if not (isinstance(nested, type) and issubclass(nested, BaseModel)):
                continue
            prefix = f"{name}_"
            named = {key: data[key] for key in data if str(key).startswith(prefix)}
            if not named:
                continue
            data = {key: value for key, value in data.items() if key not in named}
            given = data.get(name) or {}
            merged = given.model_dump() if isinstance(given, BaseModel) else dict(given)
            merged.update({key.removeprefix(prefix): value for key, value in named.items()})
            data[name] = merged
        return data

    network_allowed: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["none"],
        description="What network a run may ask for (its `network`): none (loopback alone, "
        "the default), list (any list of destinations), full (anything but the broker, the "
        "host's addresses, link-local and metadata), or comma-separated destinations a run's "
        "list must stay within (pypi.org:443,10.1.2.0/24:*). A run asking for more is refused "
        "before anything runs; a sandbox worker refuses such a call too.",
    )

    @field_validator("network_allowed", mode="before")
    @classmethod
    def _network_allowed(cls, value: object) -> object:
        texts = value.split(",") if isinstance(value, str) else value
        if isinstance(texts, list):
            NetworkAllowance.parse([str(t) for t in texts], "")
            return [str(text).strip() for text in texts if str(text).strip()] or ["none"]
        return value

    @property
    def network_allowance(self) -> NetworkAllowance:
        return NetworkAllowance.parse(self.network_allowed, NETWORK_ALLOWED_VARIABLE)

    @field_validator("image_sources", mode="before")
    @classmethod
    def _image_sources(cls, value: object) -> object:
        texts = value.split(",") if isinstance(value, str) else value
        if isinstance(texts, list):
            ImageSources.parse(str(text) for text in texts)  # one line naming a bad entry
            return [str(text).strip() for text in texts if str(text).strip()]
        return value

    @field_validator("broker_url")
    @classmethod
    def _a_broker_toolq_can_use(cls, url: str | None) -> str | None:
        return _with_scheme(url, BROKER_SCHEMES, "a broker")

    @field_validator("result_backend")
    @classmethod
    def _a_redis_for_results(cls, url: str | None) -> str | None:
        return _with_scheme(url, RESULT_SCHEMES, "a result store")

    @model_validator(mode="after")
    def _results_need_redis(self) -> FleetSettings:
        if self.result_backend is None and _scheme(self.effective_broker_url) not in RESULT_SCHEMES:
            raise ValueError(
                f"TOOLQ_RESULT_BACKEND must be a {_either(RESULT_SCHEMES)} URL when the broker "
                f"is not Redis (TOOLQ_BROKER_URL starts {_scheme(self.effective_broker_url)}://)"
            )
        return self

    @property
    def local_mode(self) -> bool:
        """No broker configured: toolq's commands start their own Redis and workers."""
        return self.broker_url is None

    @property
    def effective_broker_url(self) -> str:
        return self.broker_url or LOCAL_REDIS_URL

    @property
    def redis_url(self) -> str:
        """Where results, manifests and run state live: a Redis URL, as validation made sure."""
        return self.result_backend or self.effective_broker_url

    @property
    def hard_limit_s(self) -> float:
        """The longest any task may run before its worker child is replaced."""
        return self.max_timeout_ms / 1000 + self.hard_limit_grace_s


class WorkerSettings(FleetSettings):
    """A worker's settings: its workspaces, its tools, its sandbox."""

    workspace_root: Path = Field(
        Path(tempfile.gettempdir()) / "toolq" / "workspaces",
        description="Each run works in <workspace_root>/<run_id>, shared by both pools.",
    )
    plugins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated modules whose tools workers load."
    )
    disabled_tools: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated tools this fleet refuses to run."
    )
    mcp_servers: Path | None = Field(
        None,
        description="A JSON file listing MCP servers whose tools the workers of each server's "
        "pool host, as <server>__<tool>.",
    )
    concurrency: int | None = Field(None, gt=0, description="Worker processes per worker.")
    transfer_max_bytes: int = Field(
        DEFAULT_TRANSFER_MAX_BYTES,
        gt=0,
        description="The most bytes one service operation moves: a file read or written whole, "
        "a command's output stream (batch task files and artifacts, sandbox file transfer).",
    )
    workspace_quota_bytes: int = Field(
        1 << 30, ge=0, description="What one run's workspace may hold (1 GiB); 0: no quota."
    )
    workspace_quota_fs: Literal["off", "loop"] = Field(
        "off",
        description="loop: each run's workspace is a file system of the quota's size (a sparse "
        "ext4 image, loop-mounted; root workers with per-run uids), so no call writes past it; "
        "off: the quota holds by measuring after each call.",
    )
    workspace_ttl_s: int = Field(
        86_400, gt=0, description="A run's workspace no call touched for this long is removed."
    )

    sandbox: SandboxSettings = Field(
        default_factory=SandboxSettings,
        description="How run_bash's commands are kept apart and limited: TOOLQ_SANDBOX_<FIELD>.",
    )
    session_idle_s: float = Field(
        1800.0,
        gt=0,
        description="How long (seconds) a bash_session shell lives without a call before it "
        "ends, with everything it started; it ends with its run in any case.",
    )
    image_cache: Path = Field(
        Path(tempfile.gettempdir()) / "toolq" / "images",
        description="Where a sandbox worker keeps the images it unpacked and its runs' "
        "containers (a folder of this host's, shared by its worker processes).",
    )
    image_cache_bytes: int = Field(
        10 << 30,
        gt=0,
        description="What the unpacked images may take together (10 GiB); the least recently "
        "used image no container uses goes first.",
    )
    image_tag_ttl_s: float = Field(
        600.0,
        ge=0,
        description="How long (seconds) a tag's digest is believed without asking its registry: "
        "a run of a tag resolved less long ago starts from the image cache. Past it the registry "
        "is asked; one that cannot be reached runs the cached image the tag last named, as "
        "Docker runs its local tag when a pull fails. 0: ask every time. A reference by digest "
        "never asks.",
    )
    oci_runtime: str = Field(
        "runc",
        description="The OCI runtime that runs a run's container: runc, crun or runsc (gVisor), "
        "by name on PATH or as a path.",
    )
    registry_auth_file: Path | None = Field(
        None,
        description="Registry credentials for pulling images: a containers-auth.json or a "
        "docker config.json, as skopeo --authfile reads it.",
    )
    insecure_registries: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated registries (host[:port]) pulled from over plain HTTP or "
        "without checking their TLS certificate, e.g. a registry on loopback.",
    )

    @field_validator("mcp_servers")
    @classmethod
    def _servers_file_is_usable(cls, path: Path | None) -> Path | None:
        # Read now, so a worker with a bad file refuses to start rather than lacking tools.
        if path is not None:
            load_servers(path)
        return path

    @field_validator("plugins", "disabled_tools", "insecure_registries", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


def setting_names(cls: type[BaseModel]) -> list[tuple[str, FieldInfo]]:
    """Each setting of ``cls`` by the name its variable has after ``TOOLQ_``, lower-cased: a
    nested model's fields as ``<field>_<its field>`` (``sandbox_memory_mb``)."""
    names: list[tuple[str, FieldInfo]] = []
    for name, field in cls.model_fields.items():
        nested = field.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            names += [(f"{name}_{inner}", sub) for inner, sub in nested.model_fields.items()]
        else:
            names.append((name, field))
    return names


def variable_of(loc: tuple[int | str, ...]) -> str:
    """The variable a validation error's location names: ``("sandbox", "memory_mb")`` is
    TOOLQ_SANDBOX_MEMORY_MB."""
    name = str(loc[0])
    field = WorkerSettings.model_fields.get(name)
    nested = field.annotation if field is not None else None
    if len(loc) > 1 and isinstance(nested, type) and issubclass(nested, BaseModel):
        name = f"{name}_{loc[1]}"
    return f"{ENV_PREFIX}{name.upper()}"


@lru_cache(maxsize=1)
def get_worker_settings() -> WorkerSettings:
    return WorkerSettings()


def _scheme(url: str) -> str:
    return url.partition("://")[0].lower() if "://" in url else ""


def _with_scheme(url: str | None, schemes: tuple[str, ...], what: str) -> str | None:
    """``url`` if toolq can use it as ``what``; else a ValueError naming the schemes it takes.
    Empty is unset, as a compose file's ``${VAR:-}`` leaves it."""
    if not url:
        return None
    scheme = _scheme(url)
    if scheme in schemes and url.partition("://")[2]:
        _port_of(url, what)
        return url
    # The scheme alone: the rest of a URL may hold a password.
    found = f"it starts {scheme}://" if scheme else "it has no scheme"
    raise ValueError(f"not {what} URL toolq can use ({found}); use {_either(schemes)}")


def _port_of(url: str, what: str) -> int | None:
    """``url``'s port (None: the scheme's default); a ValueError if it is no port, which would
    fail the connection later in the URL parser's words, naming no variable."""
    try:
        return urlsplit(url).port
    except ValueError:
        # The port alone: the rest of a URL may hold a password.
        port = urlsplit(url).netloc.rpartition("@")[2].rpartition(":")[2]
        raise ValueError(
            f"not {what} URL toolq can use (its port {port!r} is not a number from 0 to 65535)"
        ) from None


def _either(schemes: tuple[str, ...]) -> str:
    """The schemes for a message: ``redis://, amqp:// or amqps://``."""
    *most, last = [f"{name}://" for name in schemes]
    return f"{', '.join(most)} or {last}" if most else last
