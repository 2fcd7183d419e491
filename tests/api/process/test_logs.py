"""Structured logs: JSON lines off a terminal, text on one, run and call ids from the context."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from api.process.logs import (
    CHATTY_LOGGERS,
    RETRY_LOGGERS,
    JsonFormatter,
    TextFormatter,
    configure_logging,
    current_context,
    log_context,
)
from api.settings import OrchestratorSettings

log = logging.getLogger("toolq.test")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore_loggers() -> Iterator[None]:
    root = logging.getLogger()
    levels = {name: logging.getLogger(name).level for name in ("", *CHATTY_LOGGERS, *RETRY_LOGGERS)}
    yield
    for handler in root.handlers[:]:
        if isinstance(handler.formatter, JsonFormatter | TextFormatter):
            root.removeHandler(handler)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def settings(**values: Any) -> OrchestratorSettings:
    return OrchestratorSettings(broker_url="redis://127.0.0.1:1/0", **values)


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_off_a_terminal_each_record_is_one_json_object() -> None:
    stream = io.StringIO()
    configure_logging(settings(), stream=stream)
    log.warning("disk %s is full\nsecond line", "sda", extra={"free_bytes": 0})
    (entry,) = json_lines(stream)
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "toolq.test"
    assert entry["message"] == "disk sda is full\nsecond line"
    assert entry["free_bytes"] == 0
    assert entry["timestamp"].endswith("+00:00")
    assert "run_id" not in entry


def test_ids_come_from_the_context_and_nest() -> None:
    stream = io.StringIO()
    configure_logging(settings(), stream=stream)
    with log_context(run_id="run-1"):
        log.info("conversation")
        with log_context(tool_call_id="call-7"):
            log.info("tool")
        log.info("conversation again")
    log.info("outside")
    entries = json_lines(stream)
    assert [(e.get("run_id"), e.get("tool_call_id")) for e in entries] == [
        ("run-1", None),
        ("run-1", "call-7"),
        ("run-1", None),
        (None, None),
    ]
    assert current_context() == {}


async def test_tasks_keep_the_run_id_they_were_started_under() -> None:
    stream = io.StringIO()
    configure_logging(settings(), stream=stream)
    go = asyncio.Event()

    async def conversation(name: str) -> None:
        await go.wait()  # bound: gathered under wait_for; logs once every block has closed
        log.info("from %s", name)

    tasks = []
    for name in ("a", "b", "c"):
        with log_context(run_id=f"run-{name}"):
            tasks.append(asyncio.create_task(conversation(name)))
    go.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    entries = json_lines(stream)
    assert sorted((e["message"], e["run_id"]) for e in entries) == [
        ("from a", "run-a"),
        ("from b", "run-b"),
        ("from c", "run-c"),
    ]


def test_an_exception_is_part_of_its_line() -> None:
    stream = io.StringIO()
    configure_logging(settings(), stream=stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("it failed")
    (entry,) = json_lines(stream)
    assert entry["message"] == "it failed"
    assert "RuntimeError: boom" in entry["exception"]


def test_on_a_terminal_lines_are_text_with_the_ids() -> None:
    stream = Terminal()
    configure_logging(settings(), stream=stream)
    with log_context(run_id="run-1", tool_call_id="call-2"):
        log.warning("slow tool")
    line = stream.getvalue().strip()
    assert "WARNING" in line
    assert "toolq.test: slow tool [run_id=run-1 tool_call_id=call-2]" in line
    with pytest.raises(ValueError):
        json.loads(line)


def test_the_format_setting_overrides_the_terminal_check() -> None:
    terminal = Terminal()
    configure_logging(settings(log_format="json"), stream=terminal)
    log.warning("as json")
    assert json_lines(terminal)[0]["message"] == "as json"

    pipe = io.StringIO()
    configure_logging(settings(log_format="text"), stream=pipe)
    log.warning("as text")
    assert pipe.getvalue().rstrip().endswith("toolq.test: as text")


def test_configuring_again_replaces_the_handler_and_sets_the_level() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging(settings(), stream=first)
    configure_logging(settings(log_level="warning"), stream=second)
    log.info("hidden")
    log.warning("shown")
    assert first.getvalue() == ""
    assert [e["message"] for e in json_lines(second)] == ["shown"]


def test_chatty_libraries_are_kept_to_warnings() -> None:
    stream = io.StringIO()
    configure_logging(settings(), stream=stream)
    logging.getLogger("httpx").info("HTTP Request: POST ... 200 OK")
    logging.getLogger("httpx").warning("connection reset")
    assert [e["message"] for e in json_lines(stream)] == ["connection reset"]


def test_the_model_clients_retries_are_logged_but_not_its_requests() -> None:
    stream = io.StringIO()
    configure_logging(settings(), stream=stream)
    client_log = logging.getLogger("openai._base_client")
    client_log.debug("Sending HTTP Request: POST")
    client_log.info("Retrying request in 0.5 seconds (retry 1 of 4)")
    logging.getLogger("openai").info("something else")
    assert [e["message"] for e in json_lines(stream)] == [
        "Retrying request in 0.5 seconds (retry 1 of 4)"
    ]


def test_an_unknown_level_falls_back_to_info_and_says_so() -> None:
    stream = io.StringIO()
    configure_logging(settings(log_level="LOUD"), stream=stream)
    log.info("still logged")
    messages = [e["message"] for e in json_lines(stream)]
    assert "TOOLQ_LOG_LEVEL=LOUD is not a logging level; using INFO" in messages
    assert "still logged" in messages
