"""The service operations as the contract states them: each request and answer crosses the wire
and comes back the same, the workers serve exactly the operations the contract names, with the
contract's requests as their published parameters, and callers refuse what workers would."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import ValidationError

from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet
from api.exceptions import ServiceCallError
from api.images.fields import ImageFields
from api.runs.workspace import RunWorkspace
from worker.contract import operations as ops
from worker.contract.operations import OPERATIONS, Operation, Refusal, Success
from worker.contract.settings import WorkerSettings
from worker.contract.wire import ResourceUsage, StreamsCut
from worker.manifest import fleet_tool_specs
from worker.tools.bash import RunBashArgs
from worker.tools.interface import parameters_schema
from worker.tools.service import PutFilesTool

#: A request and the answers of each operation, with every field the wire can carry.
EXAMPLES: dict[str, tuple[ops.OperationRequest, list[ops.WireAnswer]]] = {
    ops.PUT_FILES.name: (
        ops.PutFilesRequest(files={"a.txt": "héllo", "b.bin": {"base64": "AAE="}}),
        [
            ops.PutFilesAnswer(written={"a.txt": 6, "b.bin": 2}),
            ops.PutFilesRefusal(error="is_a_directory", message="'a' is...", written={"x": 1}),
        ],
    ),
    ops.READ_FILE.name: (
        ops.ReadFileRequest(path="a.txt", max_bytes=10),
        [
            ops.ReadFileAnswer(size=2, base64="AAE="),
            ops.FileRefusal(error="not_found", message="'a.txt' does not exist"),
        ],
    ),
    ops.COLLECT_FILES.name: (
        ops.CollectFilesRequest(patterns=["out/*.txt"], max_files=3, max_file_bytes=12),
        [
            ops.CollectFilesAnswer(
                files={
                    "out/a.txt": ops.CollectedFile(
                        content="x", encoding="utf-8", size=70, truncated=True
                    )
                },
                matched=4,
            )
        ],
    ),
    ops.REMOVE_WORKSPACE.name: (
        ops.NoArguments(),
        [
            ops.RemoveWorkspaceAnswer(removed=True),
            ops.RemoveWorkspaceAnswer(removed=False, kept="a call of the run is in flight"),
        ],
    ),
    ops.LIST_WORKSPACES.name: (
        ops.ListWorkspacesRequest(prefix="inspect-"),
        [ops.ListWorkspacesAnswer(runs=["inspect-a-1"], matched=1)],
    ),
    ops.EXEC.name: (
        ops.ExecRequest(
            argv=["wc", "-l"],
            input={"base64": "AAE="},
            cwd="sub",
            env={"A": "1"},
            timeout_ms=500,
            output_cap_bytes=100,
        ),
        [
            ops.ExecAnswer(
                stdout="1\n",
                stderr="",
                exit_code=0,
                timed_out=False,
                duration_ms=3,
                truncated=StreamsCut(stdout=True),
                isolation=["run-uid"],
                usage=ResourceUsage(cpu_ms=1, oom_killed=False),
                notice="the run's workspace is past its quota",
            )
        ],
    ),
    ops.START_ENVIRONMENT.name: (
        ops.StartEnvironmentRequest(image="python:3.12-slim", user="1000", env={"A": "1"}),
        [
            ops.StartEnvironmentAnswer(
                environment="toolq-run-1",
                image="python:3.12-slim",
                digest="sha256:" + "0" * 64,
                worker="sandbox@host",
                queue="sandbox.host",
                runtime="runc",
                workdir="/",
                user=(1000, 1000),
                start_ms=120,
                pulled=False,
            ),
            ops.ImageRefusal(message="image 'nope': not found"),
        ],
    ),
    ops.END_ENVIRONMENT.name: (
        ops.NoArguments(),
        [ops.EndEnvironmentAnswer(ended=True), ops.ImageRefusal(message="image 'x': gone")],
    ),
}


@pytest.fixture
def settings(tmp_path: Path) -> WorkerSettings:
    os.chmod(tmp_path, 0o755)
    return WorkerSettings(broker_url="redis://localhost:1/0", workspace_root=tmp_path)


def test_every_operation_has_its_example() -> None:
    assert set(EXAMPLES) == set(OPERATIONS)


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_requests_and_answers_come_back_as_they_were_sent(name: str) -> None:
    operation: Operation[Any, Any, Any] = OPERATIONS[name]
    request, answers = EXAMPLES[name]
    arguments = json.loads(json.dumps(operation.arguments(request)))
    assert operation.request.model_validate(arguments) == request
    for answer in answers:
        assert operation.read_answer(json.dumps(answer.wire())) == answer
    refusals = [answer for answer in answers if isinstance(answer, Refusal)]
    assert [type(refusal) for refusal in refusals] == ([operation.refusal] if refusals else [])
    assert [type(a) for a in answers if isinstance(a, Success)] == [operation.answer] * (
        len(answers) - len(refusals)
    )


def test_an_answer_leaves_out_its_empty_fields_and_a_request_what_the_caller_left_unset() -> None:
    assert ops.RemoveWorkspaceAnswer(removed=True).wire() == {"ok": True, "removed": True}
    assert ops.FileRefusal(error="refused", message="no").wire() == {
        "ok": False,
        "error": "refused",
        "message": "no",
    }
    assert ops.EXEC.arguments(ops.ExecRequest(command="true")) == {"command": "true"}
    assert ops.READ_FILE.arguments(ops.ReadFileRequest(path="a", max_bytes=None)) == {"path": "a"}


def test_an_answer_of_another_shape_is_refused_as_a_value_error() -> None:
    with pytest.raises(ValueError):
        ops.PUT_FILES.read_answer('{"ok": true, "sizes": {}}')
    with pytest.raises(ValueError):
        ops.EXEC.read_answer('{"ok": false, "error": "refused", "message": "exec never refuses"}')
    with pytest.raises(ValueError):
        ops.READ_FILE.read_answer("not JSON")


def test_the_workers_serve_exactly_the_contracts_operations(settings: WorkerSettings) -> None:
    served = {spec.name: spec for spec in fleet_tool_specs(settings) if not spec.for_model}
    assert set(served) == set(OPERATIONS)
    for name, operation in OPERATIONS.items():
        assert served[name].pool == operation.pool
        assert served[name].parameters == parameters_schema(operation.request)


def test_a_quota_notice_is_a_field_of_the_answer() -> None:
    tool = PutFilesTool(cast(Any, None), 1024, cast(Any, None))
    output = json.dumps(ops.PutFilesAnswer(written={}).wire())
    answer = ops.PUT_FILES.read_answer(tool.with_notice(output, "past its quota"))
    assert answer == ops.PutFilesAnswer(written={}, notice="past its quota")


async def test_a_caller_refuses_a_request_the_worker_would_refuse_and_sends_nothing() -> None:
    nowhere = RunWorkspace(cast(Dispatcher, None), Fleet(tools={}), "run-1")
    with pytest.raises(ServiceCallError) as empty_path:
        await nowhere.read_file("")
    assert empty_path.value.kind == "invalid_arguments"
    assert str(empty_path.value).startswith(
        "Error: invalid arguments for toolq.read_file: 'path': String should have at least 1"
    )
    with pytest.raises(ServiceCallError, match="'argv': Value error, an argument contains a NUL"):
        await nowhere.run(["echo", "a\x00b"])


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"A=B": "c"}, "'A=B' is not a valid variable name (no '=' or NUL, not empty)"),
        ({"": "c"}, "'' is not a valid variable name"),
        ({"A\x00": "c"}, "is not a valid variable name"),
        ({"A": "b\x00c"}, "the value of A contains a NUL byte"),
    ],
)
def test_every_request_that_sets_variables_refuses_the_same_ones_in_the_same_words(
    env: dict[str, str], problem: str
) -> None:
    requests: list[Callable[[], object]] = [
        lambda: ops.ExecRequest(command="true", env=env),
        lambda: ops.StartEnvironmentRequest(image="busybox", env=env),
        lambda: RunBashArgs(command="true", env=env),
        lambda: ImageFields(image="busybox", env=env),
    ]
    for request in requests:
        with pytest.raises(ValidationError, match=re.escape(problem)):
            request()
    assert ops.ExecRequest(command="true", env={"A": "b c=d"}).env == {"A": "b c=d"}
