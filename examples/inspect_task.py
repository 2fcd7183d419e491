"""An Inspect AI task whose tools run on the toolq fleet.

A scripted model (Inspect's mockllm) stands in for a real one, so it runs with no API key:

    inspect eval examples/inspect_task.py

With ``TOOLQ_BROKER_URL`` set it uses that fleet; without, it starts a local stack for the eval.
For a real model, drop ``model=`` and pass ``--model``; ``sandbox="toolq"`` (or ``--sandbox
toolq``) is all a task of your own needs.
"""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash, python

MODEL = "mockllm/model"


def scripted(output: ModelOutput) -> ModelOutput:
    # Scripted answers carry their usage: mockllm would count tokens with tiktoken otherwise.
    output.usage = ModelUsage(input_tokens=20, output_tokens=10, total_tokens=30)
    return output


@task
def toolq_hello() -> Task:
    answers = [
        ModelOutput.for_tool_call(MODEL, "bash", {"command": "id -un; pwd; wc -l < data.txt"}),
        ModelOutput.for_tool_call(
            MODEL, "python", {"code": "print(sum(int(n) for n in open('data.txt')))"}
        ),
        ModelOutput.from_content(MODEL, "data.txt has 3 lines; they add up to 6."),
    ]
    return Task(
        dataset=[
            Sample(
                input="How many lines does data.txt have, and what do they add up to?",
                target="6",
                files={"data.txt": "1\n2\n3\n"},
            )
        ],
        solver=[use_tools([bash(timeout=30), python(timeout=30)]), generate()],
        scorer=includes(),
        sandbox="toolq",
        model=get_model(MODEL, custom_outputs=[scripted(answer) for answer in answers]),
    )
