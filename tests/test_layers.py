"""The two floors and the contract between them: the import rule, read from the source.

``api`` (the orchestrator) may import from ``worker`` only the contract (``worker.contract``) and
the tool model (``worker.tools``), so that a change to the workers' own machinery never reaches
the orchestrator, and a fact both sides share is stated once. The contract imports nothing else
of toolq's: it is the floor both stand on.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
API_MAY_IMPORT = ("worker.contract", "worker.tools")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, with its line, at any depth (lazy imports too)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def breaches(folder: str, forbidden: str, allowed: tuple[str, ...]) -> list[str]:
    """``file:line module`` for each import of ``forbidden`` outside ``allowed``."""
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for line, module in imported_modules(path):
            inside = module == forbidden or module.startswith(forbidden + ".")
            if inside and not any(module == a or module.startswith(a + ".") for a in allowed):
                found.append(f"{path.relative_to(ROOT)}:{line} {module}")
    return found


def test_the_orchestrator_imports_only_the_contract_and_the_tool_model() -> None:
    assert breaches("api", "worker", API_MAY_IMPORT) == []


def test_the_contract_stands_on_nothing_else_of_toolqs() -> None:
    assert breaches("worker/contract", "worker", ("worker.contract",)) == []
    assert breaches("worker/contract", "api", ()) == []


def test_the_workers_never_import_the_orchestrator() -> None:
    assert breaches("worker", "api", ()) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from worker.executor import Executor\n", ["worker.executor"]),
        ("def f():\n    import worker.sandbox.run\n", ["worker.sandbox.run"]),
        ("from worker.contract.keys import keys\nfrom worker.tools import bash\n", []),
    ],
)
def test_the_rule_sees_every_kind_of_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, expected: list[str]
) -> None:
    """The checker itself: a breach at the top, or inside a function, is found; allowed ones not."""
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "module.py").write_text(source)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    found = [entry.split(" ")[1] for entry in breaches("api", "worker", API_MAY_IMPORT)]
    assert found == expected


BUILTIN_EXCEPTIONS = {
    name
    for name, value in vars(__import__("builtins")).items()
    if isinstance(value, type) and issubclass(value, BaseException)
} | {"HTTPException"}


def exception_bases() -> dict[str, tuple[str, list[str]]]:
    """Each class of ``api`` and ``worker`` by name: where it is, and its bases' last names."""
    classes: dict[str, tuple[str, list[str]]] = {}
    for folder in ("api", "worker"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    classes[node.name] = (where, bases)
    return classes


def test_every_toolq_exception_derives_from_toolq_error() -> None:
    """A caller catches toolq's refusals and faults as one kind: ``except ToolqError``."""
    classes = exception_bases()

    def reaches(name: str, goal: Callable[[str], bool], seen: frozenset[str] = frozenset()) -> bool:
        if goal(name):
            return True
        if name in seen or name not in classes:
            return False
        return any(reaches(base, goal, seen | {name}) for base in classes[name][1])

    exceptions = [
        name
        for name in classes
        if name != "ToolqError" and reaches(name, BUILTIN_EXCEPTIONS.__contains__)
    ]
    assert len(exceptions) > 20  # the check sees them
    apart = [
        f"{classes[name][0]} {name}"
        for name in exceptions
        if not reaches(name, "ToolqError".__eq__)
    ]
    assert apart == []
