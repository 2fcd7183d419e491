"""Every setting of workers and orchestrator, read from ``TOOLQ_*`` environment variables."""

from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"


class Settings(BaseSettings):
    """One place for configuration; a misspelt ``TOOLQ_`` variable is an error, not a default."""

    model_config = SettingsConfigDict(env_prefix="TOOLQ_", extra="forbid", frozen=True)

    broker_url: str | None = Field(
        None, description="Celery broker (redis:// or amqp://). Unset: toolq starts a local stack."
    )
    result_backend: str | None = Field(
        None, description="Redis URL for results; defaults to the broker URL when that is Redis."
    )
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
    default_timeout_ms: int = Field(30_000, gt=0, description="A call's deadline when none given.")
    max_timeout_ms: int = Field(600_000, gt=0, description="The largest deadline a call may ask.")
    hard_limit_grace_s: float = Field(
        5.0, gt=0, description="Seconds past the soft limit before the worker child is replaced."
    )
    reply_margin_s: float = Field(
        10.0, gt=0, description="Seconds past a call's deadline before the caller gives up."
    )
    output_cap_bytes: int = Field(51_200, gt=0, description="Cap on a tool's answer (50 KB).")
    result_ttl_s: int = Field(86_400, gt=0, description="How long results are kept.")
    concurrency: int | None = Field(None, gt=0, description="Worker processes per worker.")

    sandbox_user: str = Field("nobody", description="run_bash's user when the worker is root.")
    sandbox_isolation: Literal["auto", "namespaces", "process"] = Field(
        "auto", description="auto: PID+network namespaces where they work, else process groups."
    )
    sandbox_memory_mb: int = Field(1024, gt=0, description="run_bash address-space limit.")
    sandbox_max_processes: int = Field(256, gt=0, description="run_bash process limit.")
    sandbox_file_size_mb: int = Field(256, gt=0, description="run_bash largest file written.")

    model: str = Field("gpt-4o-mini", description="Chat model name for toolq run and batch.")
    llm_timeout_s: float = Field(60.0, gt=0, description="One model request's timeout.")
    llm_max_retries: int = Field(4, ge=0, description="Retries of a failed model request.")
    max_turns: int = Field(20, gt=0, description="Model turns per conversation.")

    api_token: str | None = Field(None, description="Bearer token for the HTTP API.")
    api_max_body_bytes: int = Field(1_048_576, gt=0, description="Largest request body.")
    log_format: Literal["auto", "json", "text"] = Field("auto", description="auto: JSON off a TTY.")
    log_level: str = Field("INFO", description="Python logging level.")

    @field_validator("plugins", "disabled_tools", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

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


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
