"""The orchestrator's and the HTTP API's settings, read from ``TOOLQ_*`` environment variables."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field, SecretStr

from worker.settings import FleetSettings


class OrchestratorSettings(FleetSettings):
    """What ``toolq run``, ``batch`` and ``serve`` need beyond the fleet's shared settings."""

    model: str = Field("gpt-4o-mini", description="Chat model name for toolq run and batch.")
    llm_timeout_s: float = Field(60.0, gt=0, description="One model request's timeout.")
    llm_max_retries: int = Field(4, ge=0, description="Retries of a failed model request.")
    max_turns: int = Field(20, gt=0, description="Model turns per conversation.")
    conversation_timeout_s: float = Field(
        3600.0,
        gt=0,
        description="The longest one batch conversation may run, in toolq batch or on an agents "
        "worker; a caller waits this plus TOOLQ_REPLY_MARGIN_S for an agents worker's answer.",
    )
    agent_concurrency: int = Field(
        100, gt=0, description="Conversations one agents worker process holds at once."
    )

    api_token: SecretStr | None = Field(None, description="Bearer token for the HTTP API.")
    api_max_body_bytes: int = Field(1_048_576, gt=0, description="Largest request body.")

    def with_fleet(self, fleet: FleetSettings) -> OrchestratorSettings:
        """These settings, pointed at ``fleet``'s broker and result store."""
        return self.model_copy(
            update={"broker_url": fleet.broker_url, "result_backend": fleet.result_backend}
        )


@lru_cache(maxsize=1)
def get_settings() -> OrchestratorSettings:
    return OrchestratorSettings()
