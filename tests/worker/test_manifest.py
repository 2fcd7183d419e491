"""What a worker publishes of its tools: which of them read the conversation, so that callers
send it only to those."""

from __future__ import annotations

from tests.worker.conftest import BUILT_INS
from worker.contract.settings import WorkerSettings
from worker.contract.wire import ToolSpec
from worker.manifest import fleet_tool_specs
from worker.tools.functions import tool

#: The built-ins and service operations that work on files, commands and the weather: none
#: reads the conversation.
BLIND = [
    *(name for name in BUILT_INS if name != "save_session_context"),
    "get_current_weather",
    "toolq.exec",
    "toolq.put_files",
]


def test_only_the_tools_that_may_read_the_conversation_say_so(settings: WorkerSettings) -> None:
    specs = {spec.name: spec for spec in fleet_tool_specs(settings)}
    assert [name for name in BLIND if specs[name].reads_context] == []
    assert specs["save_session_context"].reads_context
    # A plugin's tools may read it (a function through current_context()) unless they say not.
    assert specs["repeat"].reads_context and specs["noop"].reads_context


def test_a_function_tool_can_say_it_never_reads_the_conversation() -> None:
    def shout(word: str) -> str:
        """Shouts a word.

        Args:
            word: The word.
        """
        return word.upper()

    assert tool(shout).reads_context
    assert not tool(shout, reads_context=False).reads_context


def test_an_older_workers_spec_without_the_field_reads_the_conversation() -> None:
    published = {
        "name": "legacy",
        "description": "A tool of a worker from before the field.",
        "parameters": {"type": "object", "properties": {}},
        "pool": "tools",
        "enabled_by_default": True,
        "idempotent": False,
        "default_timeout_ms": 30_000,
    }
    assert ToolSpec.model_validate(published).reads_context
