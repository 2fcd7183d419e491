"""The suite's own rule: every wait in a test has a bound, so a test that hangs fails by that
bound, naming what it waited for (see tests/bounded.py and conftest's wait_for), instead of
hanging the run."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.syntax_trees import parse_apart, trees_under

TESTS = Path(__file__).resolve().parent
#: A line may carry this comment, followed by what bounds the wait (a cancel, an enclosing
#: wait_for, a deadline in the loop); the scan then lets it be.
EXEMPT = "# bound:"
WAITERS = {"wait", "join", "communicate"}
RUNNERS = {"run", "check_output", "check_call", "call"}
BLOCKING_IN_LOOPS = {"sleep", "accept", "recv", "wait", "poll", "readline", "select"}


def unbounded_waits(source: str, tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, what) for each wait in ``source`` (parsed into ``tree``) that nothing bounds."""
    lines = source.splitlines()
    bounded = _awaited_with_a_bound(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.While | ast.Call):
            continue
        found = _unbounded(node, bounded)
        if found and EXEMPT not in lines[node.lineno - 1]:
            yield node.lineno, found


def _unbounded(node: ast.While | ast.Call, bounded: set[ast.AST]) -> str | None:
    if isinstance(node, ast.While):
        return _endless_polling(node)
    if node in bounded:
        return None
    timed = any(keyword.arg == "timeout" for keyword in node.keywords)
    func = node.func
    if isinstance(func, ast.Attribute):
        owner = ast.unparse(func.value)
        if func.attr in WAITERS and not node.args and not timed:
            return f"{ast.unparse(node)} without a timeout"
        if owner == "subprocess" and func.attr in RUNNERS and not timed:
            return f"subprocess.{func.attr} without a timeout"
        if owner == "asyncio" and func.attr == "wait" and not timed:
            return "asyncio.wait without a timeout"
        if func.attr == "readline" and owner.endswith((".stdout", ".stderr")):
            return f"{ast.unparse(node)} on a pipe (use tests.bounded.read_line)"
        if func.attr == "get" and not node.args and not node.keywords and "queue" in owner.lower():
            return f"{ast.unparse(node)} without a timeout"
        if owner == "os" and func.attr == "waitpid" and _zero(node.args[1:2]):
            return "os.waitpid without WNOHANG"
    return None


def _awaited_with_a_bound(tree: ast.AST) -> set[ast.AST]:
    """The calls given straight to asyncio.wait_for, which bounds them."""
    return {
        node.args[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "asyncio.wait_for" and node.args
    }


def _endless_polling(loop: ast.While) -> str | None:
    if not (isinstance(loop.test, ast.Constant) and loop.test.value is True):
        return None
    body = ast.Module(body=loop.body, type_ignores=[])
    names = {n.id for n in ast.walk(body) if isinstance(n, ast.Name)}
    if any("deadline" in name for name in names):
        return None
    calls = {
        n.func.attr
        for n in ast.walk(body)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }
    blocking = calls & BLOCKING_IN_LOOPS
    return f"while True around {sorted(blocking)} without a deadline" if blocking else None


def _zero(args: list[ast.expr]) -> bool:
    return bool(args) and isinstance(args[0], ast.Constant) and args[0].value == 0


def test_every_wait_in_the_suite_has_a_bound() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}: {what}"
        for path, tree in trees_under(TESTS).items()
        for line, what in unbounded_waits(path.read_text(), tree)
    ]
    assert not found, (
        f"unbounded waits (give each a timeout, or say what bounds it after '{EXEMPT}'):\n"
        + "\n".join(found)
    )


def scan(source: str) -> list[tuple[int, str]]:
    return list(unbounded_waits(source, parse_apart({"probe.py": source})["probe.py"]))


def test_the_scan_finds_each_kind_of_unbounded_wait() -> None:
    source = (
        "proc.wait()\n"
        "thread.join()\n"
        "proc.communicate()\n"
        "subprocess.run(['x'])\n"
        "asyncio.wait(tasks)\n"
        "proc.stdout.readline()\n"
        "work_queue.get()\n"
        "os.waitpid(pid, 0)\n"
        "while True:\n    time.sleep(1)\n"
    )
    assert sorted(line for line, _ in scan(source)) == list(range(1, 10))


def test_the_scan_lets_bounded_waits_be() -> None:
    source = (
        "proc.wait(timeout=5)\n"
        "proc.wait(5)\n"
        "thread.join(5)\n"
        "subprocess.run(['x'], timeout=5)\n"
        "await asyncio.wait_for(event.wait(), 5)\n"
        "event.wait()  # bound: the task is cancelled by the test\n"
        "deadline = 1\n"
        "while True:\n    if now() > deadline: break\n    time.sleep(1)\n"
    )
    assert scan(source) == []
