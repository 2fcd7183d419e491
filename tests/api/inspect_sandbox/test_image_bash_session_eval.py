"""Inspect's own bash_session() on ``sandbox=("toolq", image)``, as on its docker sandbox: the
server of Inspect's sandbox tools, injected into the sample's container, keeps one shell whose
folder and variables stay from one call to the next, while what a plain exec leaves running in
the container is still killed.

Inspect's tools are a program linked against glibc: the image here is the tests' busybox with
the host's glibc and bash added, as a Debian-based image has them. On an image without glibc
the sandbox refuses them in one line that says so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import get_model
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash, bash_session

from api.inspect_sandbox.sandbox_tools import no_loader
from tests.api.inspect_sandbox.evals import (
    INSPECT_WARNINGS,
    MODEL,
    Scripts,
    run_eval,
    scripted_model,
    tool_messages,
)
from tests.conftest import WorkerFleet
from tests.worker.sessions.helpers import token

pytestmark = [pytest.mark.integration, INSPECT_WARNINGS]


@pytest.fixture(scope="module")
def glibc_image(image_env: tuple[WorkerFleet, str]) -> Iterator[str]:
    from tests.worker.images.builders import all_applets, build_image, glibc_files, images_folder

    with images_folder() as root:
        yield build_image(
            root / "layout",
            "glibc",
            name="toolq-glibc",
            applets=all_applets(),
            files=glibc_files(),
            usr_bin=True,
        )


def test_inspects_bash_session_keeps_its_shell_in_the_container(
    glibc_image: str, tmp_path: Path
) -> None:
    left = token()
    scripts: Scripts = {
        "session": [
            ("bash_session", {"action": "type_submit", "input": "cd /tmp && export X=1"}),
            # A plain exec between, which leaves a daemon of its own running.
            ("bash", {"command": f"setsid sleep {left} >/dev/null 2>&1 & echo left"}),
            ("bash_session", {"action": "type_submit", "input": "pwd; echo $X"}),
            (
                "bash_session",
                {
                    "action": "type_submit",
                    # The scorer reads answer.txt in the container's working folder.
                    "input": f"ps -o args | grep -c '^sleep {left}'; "
                    "echo $X > /workspace/answer.txt",
                },
            ),
        ]
    }

    log = run_eval(
        [Sample(input="session", target="1")],
        tmp_path / "logs",
        [bash_session(), bash(timeout=30)],
        scripts,
        ("toolq", glibc_image),
    )

    [sample] = log.samples or []
    messages = tool_messages(sample)
    outputs = [message.text for message in messages]
    assert all(message.error is None for message in messages), outputs
    assert outputs[1].strip() == "left", outputs
    assert [line.strip() for line in outputs[2].splitlines()[:2]] == ["/tmp", "1"], outputs
    assert outputs[3].splitlines()[0].strip() == "0", outputs  # the exec's daemon was killed
    assert sample.scores and sample.scores["answer_file"].answer == "1"


def test_an_image_without_glibc_is_refused_in_one_line_saying_so(
    image_env: tuple[WorkerFleet, str], tmp_path: Path
) -> None:
    _, image = image_env  # busybox alone, static
    task = Task(
        dataset=[Sample(input="session", target="1")],
        solver=[use_tools([bash_session()]), generate()],
        sandbox=("toolq", image),
    )
    scripts: Scripts = {"session": [("bash_session", {"action": "type_submit", "input": "pwd"})]}
    model = get_model(MODEL, custom_outputs=scripted_model(scripts))

    [log] = eval(task, model=model, log_dir=str(tmp_path), display="none")

    assert log.status == "error" and log.error is not None
    assert no_loader(image) in log.error.message, log.error.message
