"""The toolq sandbox with an image, ``sandbox=("toolq", image)``: Inspect's own conformance
checks in a container of a busybox image."""

from __future__ import annotations

import pytest
from inspect_ai.util._sandbox.self_check import *  # noqa: F403

from tests.api.inspect_sandbox.conftest import Task
from tests.api.inspect_sandbox.evals import INSPECT_WARNINGS
from tests.conftest import WorkerFleet

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module"), INSPECT_WARNINGS]


@pytest.fixture(scope="module")
def conformance_task(image_env: tuple[WorkerFleet, str]) -> Task:
    _, image = image_env
    return "conformance-image", image
