"""The two floors and the contract between them: the import rule, read from the source and
checked on what importing each module actually loads.

``api`` (the orchestrator) may import from ``worker`` only the contract (``worker.contract``), the
code both floors run the same way on it (``worker.plumbing``) and the tool model
(``TOOL_MODEL``), so that a change to the workers' own machinery never reaches
the orchestrator, and a fact both sides share is stated once. One exception, made at run time:
a conversation that runs its tools in process imports the worker's runner
(``worker.in_process``) inside the function that asks for it. The contract imports nothing
else of toolq's: it is the floor both stand on.

Within each floor, the folders import one way too: no folder imports one that imports it back,
directly or through others (``folder_cycles``).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest

from tests.syntax_trees import trees_under

ROOT = Path(__file__).resolve().parent.parent
#: What a tool is, a registry of tools, tools made of functions, the conversation a tool reads.
TOOL_MODEL = (
    "worker.tools.interface",
    "worker.tools.registry",
    "worker.tools.functions",
    "worker.tools.context",
)
#: The code both floors run the same way (jobs, heartbeat, transport, retries), on the contract.
PLUMBING = "worker.plumbing"
#: The workers' exceptions (``worker.exceptions``), which the tool model raises: classes only,
#: importing nothing but the contract's errors.
API_MAY_IMPORT = ("worker.contract", PLUMBING, "worker.exceptions", *TOOL_MODEL)
#: Imported by ``api`` only inside a function, when a conversation runs its tools in process.
API_MAY_IMPORT_AT_RUN_TIME = ("worker.in_process",)


def inside(module: str, allowed: tuple[str, ...]) -> bool:
    return any(module == a or module.startswith(a + ".") for a in allowed)


def is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def imported_modules(tree: ast.Module) -> list[tuple[int, str, bool]]:
    """Every module a file imports, with its line and whether the import runs only when a
    function is called (a lazy import), at any depth."""
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, lazy) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from worker.tools import registry`` imports the module worker.tools.registry.
            for alias in node.names:
                named = f"{node.module}.{alias.name}"
                module = named if is_module(named) else node.module
                found.append((node.lineno, module, lazy))
        in_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, lazy or in_function)

    visit(tree, False)
    return found


def breaches(
    folder: str, forbidden: str, allowed: tuple[str, ...], at_run_time: tuple[str, ...] = ()
) -> list[str]:
    """``file:line module`` for each import of ``forbidden`` outside ``allowed`` (and, for an
    import inside a function, outside ``at_run_time``)."""
    found = []
    # A folder's trees come from its floor's, parsed once for every check of that floor.
    floor = trees_under(ROOT / folder.split("/")[0])
    for path, tree in floor.items():
        if not path.is_relative_to(ROOT / folder):
            continue
        for line, module, lazy in imported_modules(tree):
            if not inside(module, (forbidden,)) or inside(module, allowed):
                continue
            if lazy and inside(module, at_run_time):
                continue
            found.append(f"{path.relative_to(ROOT)}:{line} {module}")
    return list(dict.fromkeys(found))


#: Run in a fresh interpreter: imports every module of a package in turn and prints, for each,
#: the modules its import loaded that were not loaded before (a module two of them import is
#: named under the first).
_LOADING = """
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])
loaded, found = set(sys.modules), {}
for info in sorted(pkgutil.walk_packages(package.__path__, package.__name__ + "."), key=str):
    try:
        importlib.import_module(info.name)
    except Exception as exc:
        found[info.name] = ["(import failed: %r)" % exc]
        continue
    found[info.name] = sorted(set(sys.modules) - loaded)
    loaded = set(sys.modules)
print(json.dumps(found))
"""


def loaded_by_importing(package: str, path: Path = ROOT) -> dict[str, list[str]]:
    """Each module of ``package`` (found on ``path``) with the modules importing it loads."""
    done = subprocess.run(
        [sys.executable, "-c", _LOADING, package],
        cwd=path,
        env={"PYTHONPATH": f"{path}:{ROOT}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    loaded: dict[str, list[str]] = json.loads(done.stdout)
    return loaded


def loaded_breaches(loaded: dict[str, list[str]]) -> list[str]:
    """``module: name`` for each module of ``worker`` outside the contract and the tool model
    in what importing each module loaded (``loaded_by_importing``); the packages above those
    aside, whose ``__init__`` comes with them."""
    packages_above = {
        ".".join(name.split(".")[:depth])
        for name in API_MAY_IMPORT
        for depth in range(1, name.count(".") + 1)
    }
    return [
        f"{module}: {name}"
        for module, names in loaded.items()
        for name in names
        if name.startswith("(")
        or (
            inside(name, ("worker",))
            and not inside(name, API_MAY_IMPORT)
            and name not in packages_above
        )
    ]


def test_the_orchestrator_imports_only_the_contract_and_the_tool_model() -> None:
    assert breaches("api", "worker", API_MAY_IMPORT, API_MAY_IMPORT_AT_RUN_TIME) == []


def test_importing_any_orchestrator_module_loads_only_the_contract_and_the_tool_model() -> None:
    """What an import line hides: a module of the tool model that imported the sandbox would
    bring it into every orchestrator process, and no import line of ``api`` would show it."""
    loaded = loaded_by_importing("api")
    assert len(loaded) > 100  # every module was imported
    assert loaded_breaches(loaded) == []


def test_the_contract_stands_on_nothing_else_of_toolqs() -> None:
    assert breaches("worker/contract", "worker", ("worker.contract",)) == []
    assert breaches("worker/contract", "api", ()) == []


def test_the_shared_plumbing_stands_on_the_contract_alone() -> None:
    assert breaches("worker/plumbing", "worker", ("worker.contract", PLUMBING)) == []
    assert breaches("worker/plumbing", "api", ()) == []


def test_the_workers_never_import_the_orchestrator() -> None:
    assert breaches("worker", "api", ()) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from worker.executor import Executor\n", ["worker.executor"]),
        ("def f():\n    import worker.sandbox.command\n", ["worker.sandbox.command"]),
        ("from worker.contract.keys import keys\nfrom worker.tools import registry\n", []),
        ("from worker.tools.factory import prepare_workspace\n", ["worker.tools.factory"]),
        ("from worker.in_process import LocalCalls\n", ["worker.in_process"]),
        ("def f():\n    from worker.in_process import LocalCalls\n", []),
    ],
)
def test_the_rule_sees_every_kind_of_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, expected: list[str]
) -> None:
    """The checker itself: a breach at the top, or inside a function, is found; allowed ones not."""
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "module.py").write_text(source)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    found = [
        entry.split(" ")[1]
        for entry in breaches("api", "worker", API_MAY_IMPORT, API_MAY_IMPORT_AT_RUN_TIME)
    ]
    assert found == expected


def test_the_loading_check_sees_what_an_allowed_import_brings(tmp_path: Path) -> None:
    """The checker itself: an import of the tool model is fine; one that brings the workers'
    machinery along is named with what it brought, and a lazy import brings nothing."""
    package = tmp_path / "probe_api"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fine.py").write_text("from worker.tools.registry import ToolRegistry\n")
    (package / "lazy.py").write_text("def f():\n    import worker.in_process\n")
    (package / "leaky.py").write_text("from worker.tools import factory\n")

    found = loaded_breaches(loaded_by_importing("probe_api", tmp_path))

    assert not any(entry.startswith(("probe_api.fine:", "probe_api.lazy:")) for entry in found)
    assert "probe_api.leaky: worker.tools.factory" in found
    assert "probe_api.leaky: worker.sandbox" in found


def folder_of(module: str, root: Path) -> str | None:
    """The folder of ``api`` or ``worker`` a module is in (its first level: ``api/http`` holds
    ``api.http.viewer.store``), or for a module at the top, the module itself."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    top, first = parts[0], parts[1]
    return f"{top}/{first}" if (root / top / first).is_dir() else f"{top}/{first}.py"


def folder_imports(top: str, root: Path = ROOT) -> dict[str, dict[str, str]]:
    """Which folders of ``top`` each folder imports, from its import statements at any depth
    (a lazy import is an arrow too), with the first ``file:line`` that makes each arrow."""
    arrows: dict[str, dict[str, str]] = {}
    for path, tree in trees_under(root / top).items():
        parts = path.relative_to(root).with_suffix("").parts
        source = folder_of(".".join(parts), root)
        if source is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for name in names:
                target = folder_of(name, root) if name.split(".")[0] == top else None
                if target is not None and target != source:
                    where = f"{path.relative_to(root)}:{node.lineno}"
                    arrows.setdefault(source, {}).setdefault(target, where)
    return arrows


def folder_cycles(arrows: dict[str, dict[str, str]]) -> list[str]:
    """Each cycle among the folders, as ``a -> b (file:line) -> ... -> a``: one for each group
    of folders that reach each other (Tarjan's strongly connected components), so a fix is
    judged against every arrow that closes the loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(folder: str) -> None:
        index[folder] = low[folder] = len(index)
        stack.append(folder)
        for target in arrows.get(folder, {}):
            if target not in index:
                visit(target)
                low[folder] = min(low[folder], low[target])
            elif target in stack:
                low[folder] = min(low[folder], index[target])
        if low[folder] == index[folder]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == folder:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for folder in sorted(arrows):
        if folder not in index:
            visit(folder)
    return [_a_cycle_through(group, arrows) for group in groups]


def _a_cycle_through(group: list[str], arrows: dict[str, dict[str, str]]) -> str:
    """One cycle inside ``group`` (folders that all reach each other), from its first folder,
    each arrow with the import that makes it."""
    start = group[0]
    paths = {start: [start]}
    queue = [start]
    while queue:  # breadth first: the shortest way back to ``start``
        folder = queue.pop(0)
        for target in sorted(arrows.get(folder, {})):
            if target == start:
                way = [*paths[folder], start]
                return (
                    " -> ".join(f"{a} ({arrows[a][b]})" for a, b in pairwise(way)) + f" -> {start}"
                )
            if target in group and target not in paths:
                paths[target] = [*paths[folder], target]
                queue.append(target)
    raise AssertionError(f"no cycle through {group}")  # a group of two or more always has one


@pytest.mark.parametrize("top", ["api", "worker"])
def test_no_folder_imports_a_folder_that_imports_it_back(top: str) -> None:
    """Within each floor, the folders (and the modules at its top) import one way: one that a
    folder imports never reaches it again, however many folders lie between."""
    arrows = folder_imports(top)
    assert len(arrows) > 5  # the check sees the folders
    assert folder_cycles(arrows) == []


def test_the_cycle_check_names_a_cycle_however_long(tmp_path: Path) -> None:
    """The checker itself: a loop through three folders is found and named arrow by arrow; a
    folder importing itself, or a one-way chain, is not a cycle."""
    for folder, source in {
        "a": "from probe.b.x import y\nfrom probe.a.other import z\n",
        "b": "def f():\n    import probe.c\n",
        "c": "from probe import a\n",
        "d": "from probe.a.x import y\n",
    }.items():
        (tmp_path / "probe" / folder).mkdir(parents=True)
        (tmp_path / "probe" / folder / "x.py").write_text(source)

    found = folder_cycles(folder_imports("probe", tmp_path))

    assert found == [
        "probe/a (probe/a/x.py:1) -> probe/b (probe/b/x.py:2) -> probe/c (probe/c/x.py:1)"
        " -> probe/a"
    ]


BUILTIN_EXCEPTIONS = {
    name
    for name, value in vars(__import__("builtins")).items()
    if isinstance(value, type) and issubclass(value, BaseException)
} | {"HTTPException"}


def exception_bases() -> dict[str, tuple[str, list[str]]]:
    """Each class of ``api`` and ``worker`` by name: where it is, and its bases' last names."""
    classes: dict[str, tuple[str, list[str]]] = {}
    for folder in ("api", "worker"):
        for path, tree in trees_under(ROOT / folder).items():
            for node in ast.walk(tree):
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


#: Where toolq's exceptions are, each module's docstring drawing its part of the tree: those that
#: cross between the sides, then each side's own.
EXCEPTION_MODULES = ("worker/contract/errors.py", "worker/exceptions.py", "api/exceptions.py")
#: Drawn in their side's tree, defined beside what they carry (``api/exceptions.py`` says why).
DEFINED_APART = {
    "BodyTooLarge": "api/http/auth.py",
    "LimitReached": "api/conversation/limits.py",
    "CapReached": "api/state/tenant_caps.py",
}


def test_every_toolq_exception_is_in_its_sides_exceptions_module() -> None:
    """A reader sees in one screen per side what can be raised and what catches what; a private
    exception that never leaves its module may stay there."""
    classes = exception_bases()

    def is_toolq_error(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name == "ToolqError":
            return True
        if name in seen or name not in classes:
            return False
        return any(is_toolq_error(base, seen | {name}) for base in classes[name][1])

    elsewhere = [
        f"{where} {name}"
        for name, (where, _) in classes.items()
        if is_toolq_error(name)
        and not name.startswith("_")
        and where.split(":")[0] not in (*EXCEPTION_MODULES, DEFINED_APART.get(name))
    ]
    assert elsewhere == []
    trees = {**trees_under(ROOT / "api"), **trees_under(ROOT / "worker")}
    drawn_for_api = ast.get_docstring(trees[ROOT / "api/exceptions.py"]) or ""
    assert [name for name in DEFINED_APART if name not in drawn_for_api] == []
    for path in EXCEPTION_MODULES:
        drawn = ast.get_docstring(trees[ROOT / path]) or ""
        defined = [name for name, (where, _) in classes.items() if where.startswith(path + ":")]
        assert [name for name in defined if name not in drawn] == [], path
