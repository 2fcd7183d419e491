"""The trees the tests that read the project's code stand on: whole, whatever garbage the test
process holds."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.syntax_trees import parse_apart

ROOT = Path(__file__).resolve().parent.parent


class _UnclosedSocket:
    """Garbage whose finalizer parses, as pytest's hook does when the collector finds a socket
    left unclosed: it formats the warning's traceback, parsing each line for the carets."""

    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it, whenever it runs

    def __del__(self) -> None:
        ast.parse("sock.close()")


def test_the_trees_come_back_whole_while_the_collector_formats_a_warning() -> None:
    """What a run saw: reading the project's modules failed with 'AST constructor recursion
    depth mismatch' when a parse began in the middle of the test's own."""
    source = (ROOT / "worker/images/boxes.py").read_text()
    expected = ast.dump(parse_apart({"boxes.py": source})["boxes.py"])
    for round_ in range(20):
        _UnclosedSocket()
        trees = parse_apart({f"boxes-{n}.py": source for n in range(5)})
        assert [ast.dump(tree) for tree in trees.values()] == [expected] * 5, round_


def test_a_source_that_does_not_parse_is_named_with_its_error() -> None:
    with pytest.raises(AssertionError, match=r"^parsing failed: broken\.py:1: invalid syntax$"):
        parse_apart({"fine.py": "x = 1\n", "broken.py": "def f(:\n"})
