"""The orchestrator's and the HTTP API's settings, read from ``TOOLQ_*`` environment variables."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from worker.contract.errors import SettingsError
from worker.contract.network import NetworkAllowance, network_refusal, tenant_allowances
from worker.contract.run_limits import LimitsMax, RunLimits
from worker.contract.settings import FleetSettings, WorkerSettings
from worker.contract.settings_check import settings_problems

#: Where the model client looks for the chat API (the openai client's own variable).
MODEL_URL_VARIABLE = "OPENAI_BASE_URL"


class OrchestratorSettings(FleetSettings):
    """What ``toolq run``, ``batch`` and ``serve`` need beyond the fleet's shared settings."""

    model: str = Field("gpt-4o-mini", description="Chat model name for toolq run and batch.")
    llm_timeout_s: float = Field(60.0, gt=0, description="One model request's timeout.")
    llm_max_retries: int = Field(4, ge=0, description="Retries of a failed model request.")
    max_turns: int = Field(20, gt=0, description="Model turns per conversation.")
    task_files_max_bytes: int = Field(
        10 * 1024 * 1024, gt=0, description="The most bytes of `files` one batch item may carry."
    )
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
    api_tokens_file: Path | None = Field(
        None,
        description="A file of `<tenant-name> <token>` lines: one bearer token per tenant of the "
        "HTTP API, each seeing only its own runs and batches.",
    )
    api_max_body_bytes: int = Field(1_048_576, gt=0, description="Largest request body.")
    tenant_max_runs: int = Field(
        100,
        ge=0,
        description="The most runs one tenant of the HTTP API may have live at once: its runs, "
        "and the conversations its batches run at once (each holds a sandbox uid while it "
        "lives). One more is refused with 429; 0: no cap.",
    )
    tenant_max_mcp_sessions: int = Field(
        20,
        ge=0,
        description="The most MCP sessions one tenant may hold open at once on /mcp (each "
        "session is a run, with a sandbox uid). One more is refused with an MCP error; 0: no cap.",
    )

    tenant_network_allowed: str | None = Field(
        None,
        description="Per tenant of TOOLQ_API_TOKENS_FILE, what network its runs may ask for, "
        "within TOOLQ_NETWORK_ALLOWED: acme=pypi.org:443,files.pythonhosted.org:443;ci=full. A "
        "tenant it does not name keeps TOOLQ_NETWORK_ALLOWED.",
    )

    @field_validator("tenant_network_allowed")
    @classmethod
    def _tenant_network_allowed(cls, value: str | None) -> str | None:
        tenant_allowances(value, "")  # one line naming a bad part
        return value

    tenant_limits_max: dict[str, LimitsMax] = Field(
        default_factory=dict,
        description="Per tenant of TOOLQ_API_TOKENS_FILE, the most its runs may ask for their "
        'commands (`limits`), within TOOLQ_LIMITS_MAX_*, as JSON: {"acme": {"memory_mb": 512, '
        '"pids": 64}}. A field a tenant leaves out, and a tenant it does not name, keep the '
        "fleet's.",
    )

    def limits_refusal(self, limits: RunLimits, tenant: str | None = None) -> str | None:
        """Why a run (of ``tenant``, where tokens name tenants) may not ask ``limits``, in one
        line: the fleet's maximums first, then the tenant's own; None where it may."""
        fleet = self.limits_max.refusal(limits, self.max_timeout_ms)
        own = self.tenant_limits_max.get(tenant) if tenant is not None else None
        if fleet is not None or own is None:
            return fleet
        whose = f"tenant {tenant} may (TOOLQ_TENANT_LIMITS_MAX)"
        return self.limits_max.narrowed(own).refusal(limits, self.max_timeout_ms, whose)

    def network_refusal(
        self, network: object, tenant: str | None = None, *, fleet: bool = True
    ) -> str | None:
        """Why a run (of ``tenant``, where tokens name tenants) may not have ``network``, in
        one line; None where it may. ``fleet=False``: the tenant's narrowing alone."""
        allowances = tenant_allowances(self.tenant_network_allowed)
        own = allowances.get(tenant) if tenant is not None else None
        return network_refusal(
            network,
            self.network_allowance if fleet else NetworkAllowance("full"),
            None if own is None else (str(tenant), own),
        )

    def with_fleet(self, fleet: FleetSettings) -> OrchestratorSettings:
        """These settings, pointed at ``fleet``'s broker and result store."""
        return self.model_copy(
            update={"broker_url": fleet.broker_url, "result_backend": fleet.result_backend}
        )


@lru_cache(maxsize=1)
def get_settings() -> OrchestratorSettings:
    return OrchestratorSettings()


def model_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a chat API's base URL, or None. Such a URL fails every request the
    same way, so it is refused before any is sent rather than retried."""
    parts = urlsplit(url)
    if parts.scheme in ("http", "https") and parts.hostname:
        return None
    if "@" in url:
        found = "it is not one"  # never shown: it may hold credentials
    elif parts.netloc:
        found = f"it starts {parts.scheme}://"
    else:
        found = f"it is {url!r}"
    return (
        f"{MODEL_URL_VARIABLE} must be an http:// or https:// URL such as "
        f"http://localhost:11434/v1 ({found})"
    )


def check_settings() -> None:
    """What every ``toolq`` command checks before it starts anything; ``SettingsError`` names
    each problem. Workers' settings are checked too: in local mode toolq starts workers with
    this environment."""
    problems = settings_problems([OrchestratorSettings, WorkerSettings])
    model_url = os.environ.get(MODEL_URL_VARIABLE)
    if model_url and (problem := model_url_problem(model_url)):
        problems.append(problem)
    if problems:
        raise SettingsError(problems)
