"""The trees the tests that read the project's code stand on: whole, whatever the test process's
other threads are doing."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest

from tests.syntax_trees import parse_apart

ROOT = Path(__file__).resolve().parent.parent


class _Litter:
    """Garbage in a cycle with a finalizer that runs Python code: the collector runs it in
    whichever thread is allocating, and that thread may then hand the interpreter over."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        sum(range(100))


def _parse_with_litter(source: str, stop: threading.Event) -> None:
    while not stop.is_set():
        for _ in range(50):
            _Litter()
        ast.parse(source)


def test_the_trees_come_back_whole_while_another_thread_parses() -> None:
    """What a loaded run saw: another thread of the test process parses (pytest formatting the
    warning of an unclosed socket) while a test reads the project's modules."""
    source = (ROOT / "worker/images/boxes.py").read_text()
    expected = ast.dump(ast.parse(source))
    stop = threading.Event()
    other = threading.Thread(target=_parse_with_litter, args=(source, stop))
    other.start()
    try:
        for round_ in range(5):
            for _ in range(50):
                _Litter()
            trees = parse_apart({f"boxes-{n}.py": source for n in range(20)})
            assert [ast.dump(tree) for tree in trees.values()] == [expected] * 20, round_
    finally:
        stop.set()
        other.join(timeout=60)
    assert not other.is_alive()


def test_a_source_that_does_not_parse_is_named_with_its_error() -> None:
    with pytest.raises(AssertionError, match=r"^parsing failed: broken\.py:1: invalid syntax$"):
        parse_apart({"fine.py": "x = 1\n", "broken.py": "def f(:\n"})
