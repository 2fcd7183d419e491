"""Inspect's own conformance checks for sandbox environments, run against ``toolq`` on real
workers. Those the toolq sandbox does not meet by design are expected to fail, each with why."""

from __future__ import annotations

import pytest
from inspect_ai.util._sandbox.self_check import *  # noqa: F403

from tests.api.inspect_sandbox.conftest import Task
from tests.conftest import WorkerFleet

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture(scope="module")
def conformance_task(fleet_env: WorkerFleet) -> Task:
    return "conformance", None
