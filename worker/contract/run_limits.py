"""A run's own limits: the time, memory, processes and CPU a task may ask for its calls, within
the maximums the operator sets. They travel with each call (``ToolCallRequest.limits``), the
worker applies them to the call's control group, rlimits and deadline, and the answer's usage
says what applied (``ResourceUsage.limits``)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.contract.errors import validation_problems


class RunLimits(BaseModel):
    """What a run asks for its calls; a field left out is the fleet's default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float | None = Field(
        None,
        gt=0,
        description="The longest one call of the run may take, in seconds: a command's "
        "timeout is cut to it. At most TOOLQ_MAX_TIMEOUT_MS.",
    )
    memory_mb: int | None = Field(
        None, gt=0, description="A command's memory limit, in MiB (TOOLQ_SANDBOX_MEMORY_MB)."
    )
    pids: int | None = Field(
        None,
        gt=0,
        description="The most processes a command may have at once (TOOLQ_SANDBOX_MAX_PROCESSES).",
    )
    cpu: float | None = Field(
        None,
        gt=0,
        description="CPUs a command may use together, e.g. 0.5 or 2 (TOOLQ_SANDBOX_CPU).",
    )

    @classmethod
    def parse(cls, text: str) -> RunLimits:
        """Limits as a person writes them: ``memory_mb=64,pids=32`` or a JSON object;
        ``ValueError`` in one line."""
        text = text.strip()
        data: Any
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except ValueError as exc:
                raise ValueError(f"limits are not valid JSON: {exc}") from None
        else:
            data = {}
            for part in filter(None, (piece.strip() for piece in text.split(","))):
                name, equals, value = part.partition("=")
                if not equals:
                    raise ValueError(
                        f"limits are written name=value, e.g. memory_mb=512,pids=64 (not {part!r})"
                    )
                data[name.strip()] = value.strip()
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ValueError(f"limits: {validation_problems(exc, 'limits')}") from None


class LimitsMax(BaseModel):
    """The most a run may ask (``TOOLQ_LIMITS_MAX_<FIELD>``); the time's is TOOLQ_MAX_TIMEOUT_MS."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_mb: int = Field(4096, gt=0, description="The most memory a run may ask, in MiB.")
    pids: int = Field(1024, gt=0, description="The most processes a run may ask.")
    cpu: float = Field(4.0, gt=0, description="The most CPUs a run may ask.")

    def refusal(
        self, limits: RunLimits, max_timeout_ms: int, whose: str = "this fleet allows"
    ) -> str | None:
        """Why ``limits`` asks more than ``whose`` maximums let it, in one line; None when it
        does not."""
        over = []
        if limits.timeout_s is not None and limits.timeout_s * 1000 > max_timeout_ms:
            over.append(f"timeout_s={limits.timeout_s:g} (at most {max_timeout_ms / 1000:g})")
        for name in ("memory_mb", "pids", "cpu"):
            asked, most = getattr(limits, name), getattr(self, name)
            if asked is not None and asked > most:
                over.append(f"{name}={asked} (at most {most})")
        if not over:
            return None
        return f"the run asks more than {whose}: {', '.join(over)}"

    def narrowed(self, other: LimitsMax) -> LimitsMax:
        """The lower of each maximum ``other`` names: a tenant's own within the fleet's (a
        field the tenant leaves out stays the fleet's)."""
        return self.model_copy(
            update={
                name: min(getattr(self, name), getattr(other, name))
                for name in other.model_fields_set
            }
        )


class LimitsFields(BaseModel):
    """What a run says of its own limits, wherever a run is described (a batch task line,
    Inspect's sandbox configuration)."""

    limits: RunLimits | None = Field(
        None,
        description='The run\'s own limits for its commands, e.g. {"memory_mb": 512, "pids": 64}: '
        "timeout_s, memory_mb, pids, cpu, each at most TOOLQ_LIMITS_MAX_* (the time "
        "TOOLQ_MAX_TIMEOUT_MS); a field left out is the fleet's default.",
    )
