"""Inspect evals in the toolq sandbox, for the tests: a scripted model (Inspect's mockllm), a
tool that reads a file of the sandbox, a scorer that reads the answer from the sandbox, and what
the eval log tells."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.event import InfoEvent
from inspect_ai.log import EvalLog, EvalSample
from inspect_ai.model import ChatMessage, ChatMessageTool, ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import TaskState, generate, use_tools
from inspect_ai.tool import Tool, tool
from inspect_ai.util import sandbox

MODEL = "mockllm/model"
#: By sample input: the tool calls the model makes, one per turn, before it answers.
Scripts = dict[str, list[tuple[str, dict[str, str]]]]
#: Inspect's own use of tenacity, which deprecated a parameter Inspect still passes.
INSPECT_WARNINGS = pytest.mark.filterwarnings(
    "ignore:The 'initial' parameter is deprecated:DeprecationWarning"
)


@tool
def read_text() -> Tool:
    async def execute(path: str) -> str:
        """Read a text file of the sandbox.

        Args:
          path: The file's path.
        """
        return await sandbox().read_file(path)

    return execute


def scripted_model(scripts: Scripts) -> Callable[..., Any]:
    """Inspect's mockllm answering each sample from its script: the sample's input names it, and
    the number of answers given so far is the step."""

    def answer(messages: list[ChatMessage], *_: Any) -> ModelOutput:
        steps = scripts[messages[0].text]
        turn = sum(1 for message in messages if message.role == "assistant")
        if turn < len(steps):
            name, arguments = steps[turn]
            output = ModelOutput.for_tool_call(MODEL, name, arguments)
        else:
            output = ModelOutput.from_content(MODEL, "done")
        # mockllm would count tokens with tiktoken, which fetches its encoding from the network.
        output.usage = ModelUsage(input_tokens=10, output_tokens=5, total_tokens=15)
        return output

    return answer


@scorer(metrics=[accuracy()])
def answer_file() -> Any:
    """Correct when the sandbox's answer.txt holds the target: scored through the sandbox too."""

    async def score(state: TaskState, target: Target) -> Score:
        try:
            found = (await sandbox().read_file("answer.txt")).strip()
        except FileNotFoundError:
            return Score(value=INCORRECT, answer=None)
        return Score(value=CORRECT if found == target.text else INCORRECT, answer=found)

    return score


def run_eval(
    samples: list[Sample],
    log_dir: Path,
    tools: list[Tool],
    scripts: Scripts,
    sandbox: str | tuple[str, str] = "toolq",
) -> EvalLog:
    """One eval of ``samples`` in the toolq sandbox (``("toolq", image)``: in containers of
    the image), the model playing ``scripts``."""
    task = Task(
        dataset=samples,
        solver=[use_tools(tools), generate()],
        scorer=answer_file(),
        sandbox=sandbox,
    )
    model = get_model(MODEL, custom_outputs=scripted_model(scripts))
    [log] = eval(task, model=model, log_dir=str(log_dir), display="none", max_samples=4)
    assert log.status == "success", log.error
    return log


def tool_messages(sample: EvalSample) -> list[ChatMessageTool]:
    return [message for message in sample.messages if isinstance(message, ChatMessageTool)]


def workers_that_ran(sample: EvalSample) -> list[str]:
    """The workers the sandbox named for each command, as the sample's transcript records."""
    return [
        str(event.data["worker"])
        for event in sample.events
        if isinstance(event, InfoEvent) and event.source == "toolq" and isinstance(event.data, dict)
    ]
