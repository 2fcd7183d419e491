"""Fixtures for tests against real workers: a dispatcher and a helper that calls one tool."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

from api.dispatch import Dispatcher
from api.fleet import read_manifest
from tests.conftest import WorkerFleet
from worker.protocol import ToolCallResult, ToolSpec
from worker.settings import WorkerSettings

pytestmark = pytest.mark.integration


class Caller:
    """Calls tools by name on a fleet, the way the orchestrator does."""

    def __init__(self, dispatcher: Dispatcher, settings: WorkerSettings, run_id: str) -> None:
        self.dispatcher = dispatcher
        self.settings = settings
        self.run_id = run_id
        client = redis.Redis.from_url(settings.redis_url)
        self.specs = read_manifest(client)
        client.close()

    def spec(self, tool: str, pool: str | None = None) -> ToolSpec:
        known = self.specs.get(tool)
        if known is not None and pool is None:
            return known
        # A tool the fleet does not have, or a known one sent to another pool: crafted calls.
        base = known or ToolSpec(
            name=tool,
            description="",
            parameters={},
            pool="tools",
            enabled_by_default=True,
            idempotent=False,
            default_timeout_ms=5000,
        )
        return base.model_copy(update={"pool": pool or base.pool})

    async def __call__(
        self,
        tool: str,
        arguments: dict[str, Any] | str,
        *,
        pool: str | None = None,
        timeout_ms: int | None = None,
        task_id: str | None = None,
        run_id: str | None = None,
    ) -> ToolCallResult:
        spec = self.spec(tool, pool)
        request = self.dispatcher.build_request(
            spec,
            task_id=task_id or f"call-{uuid.uuid4().hex}",
            run_id=run_id or self.run_id,
            arguments=arguments,
            timeout_ms=timeout_ms,
        )
        return await self.dispatcher.call(request, spec.pool)


@pytest.fixture
async def call(fleet: WorkerFleet) -> AsyncIterator[Caller]:
    async with Dispatcher(fleet.settings) as dispatcher:
        yield Caller(dispatcher, fleet.settings, f"run-{uuid.uuid4().hex[:12]}")
