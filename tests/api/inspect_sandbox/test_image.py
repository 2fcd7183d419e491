"""The toolq sandbox with an image, ``sandbox=("toolq", image)``: Inspect's own conformance
checks in a container of a busybox image."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._sandbox.self_check import *  # noqa: F403

from api.inspect_sandbox import ToolqSandboxEnvironment
from tests.api.inspect_sandbox.evals import INSPECT_WARNINGS
from tests.api.inspect_sandbox.test_conformance import KNOWN_FAILURES
from tests.conftest import WorkerFleet

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module"), INSPECT_WARNINGS]

TASK = "conformance-image"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def toolq_task(image_env: tuple[WorkerFleet, str]) -> AsyncIterator[str]:
    _, image = image_env
    await ToolqSandboxEnvironment.task_init(TASK, image)
    yield image
    await ToolqSandboxEnvironment.task_cleanup(TASK, image, True)


@pytest_asyncio.fixture(loop_scope="module")
async def sandbox_env(
    toolq_task: str, request: pytest.FixtureRequest
) -> AsyncIterator[SandboxEnvironment]:
    reason = KNOWN_FAILURES.get(request.node.originalname)
    if reason is not None:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    environments = await ToolqSandboxEnvironment.sample_init(TASK, toolq_task, {})
    yield environments["default"]
    await ToolqSandboxEnvironment.sample_cleanup(TASK, toolq_task, environments, False)
