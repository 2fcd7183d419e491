"""Settings read from ``TOOLQ_*`` environment variables: what the whole fleet shares, and what
only workers need. The orchestrator's own settings are in ``api.settings``."""

from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from worker.capping import DEFAULT_OUTPUT_CAP_BYTES

LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"


class FleetSettings(BaseSettings):
    """What workers and callers must agree on: where the broker is, deadlines, the output cap.

    A misspelt field is an error, not a default (``extra="forbid"``).
    """

    model_config = SettingsConfigDict(env_prefix="TOOLQ_", extra="forbid", frozen=True)

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
    output_cap_bytes: int = Field(
        DEFAULT_OUTPUT_CAP_BYTES, gt=0, description="Cap on every tool's answer (50 KB)."
    )
    result_ttl_s: int = Field(86_400, gt=0, description="How long results are kept.")
    log_format: Literal["auto", "json", "text"] = Field("auto", description="auto: JSON off a TTY.")
    log_level: str = Field("INFO", description="Python logging level.")

    @property
    def local_mode(self) -> bool:
        """No broker configured: toolq's commands start their own Redis and workers."""
        return self.broker_url is None

    @property
    def effective_broker_url(self) -> str:
        return self.broker_url or LOCAL_REDIS_URL

    @property
    def redis_url(self) -> str:
        """Where results, manifests and run state live."""
        if self.result_backend:
            return self.result_backend
        broker = self.effective_broker_url
        if broker.startswith(("redis://", "rediss://", "unix://")):
            return broker
        raise ValueError(
            "TOOLQ_RESULT_BACKEND must name a Redis URL when the broker is not Redis "
            f"(broker is {broker.split('://')[0]}://...)"
        )

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
    concurrency: int | None = Field(None, gt=0, description="Worker processes per worker.")
    workspace_quota_bytes: int = Field(
        1 << 30, ge=0, description="What one run's workspace may hold (1 GiB); 0: no quota."
    )
    workspace_ttl_s: int = Field(
        86_400, gt=0, description="A run's workspace no call touched for this long is removed."
    )

    sandbox_user: str = Field("nobody", description="run_bash's user when the worker is root.")
    sandbox_isolation: Literal["auto", "namespaces", "process"] = Field(
        "auto", description="auto: PID+network namespaces where they work, else process groups."
    )
    sandbox_memory_mb: int = Field(
        1024,
        gt=0,
        description="run_bash memory limit: resident memory and swap of the whole command "
        "(control group), or the address space of each process where no group can be made.",
    )
    sandbox_max_processes: int = Field(
        256, gt=0, description="run_bash process limit: per call (control group), else per user."
    )
    sandbox_file_size_mb: int = Field(256, gt=0, description="run_bash largest file written.")
    sandbox_cgroup: Literal["auto", "v2", "v1", "off"] = Field(
        "auto",
        description="Control groups for run_bash: auto takes each job from v2, else v1; v2 or "
        "v1 use only that version; off uses rlimits alone.",
    )
    sandbox_cgroup_root: Path = Field(
        Path("/sys/fs/cgroup"), description="Where the cgroup file systems are mounted."
    )

    @field_validator("plugins", "disabled_tools", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


@lru_cache(maxsize=1)
def get_worker_settings() -> WorkerSettings:
    return WorkerSettings()
