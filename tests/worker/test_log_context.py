"""A worker's own log format, made to show the ids of the call each line was written for."""

from __future__ import annotations

import io
import logging

from worker.plumbing.log_context import log_context, show_ids


def test_lines_written_during_a_call_carry_its_ids_after_the_first_line() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s/%(processName)s %(message)s"))
    logger = logging.getLogger("test.worker.contract.runtime.log_context")
    logger.addHandler(handler)
    logger.propagate = False
    # Its own level, whatever earlier tests did to the root logger's (or disabled).
    logger.setLevel(logging.INFO)
    logger.disabled = False
    try:
        show_ids(logger)
        show_ids(logger)  # a second setup adds nothing twice
        logger.warning("outside any call")
        with log_context(run_id="run-3", tool_call_id="call_4"):
            try:
                raise ValueError("bad")
            except ValueError:
                logger.warning("tool x raised", exc_info=True)
    finally:
        logger.removeHandler(handler)

    lines = stream.getvalue().splitlines()
    assert lines[0] == "WARNING/MainProcess outside any call"
    assert lines[1] == "WARNING/MainProcess tool x raised [run_id=run-3 tool_call_id=call_4]"
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: bad"
    assert len(handler.filters) == 1
