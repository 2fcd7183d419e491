"""Python sources parsed into syntax trees in a fresh interpreter, for the tests that read the
project's code (its layers, the suite's own rules).

CPython 3.11 counts the depth of the tree ``ast.parse`` builds in one counter per interpreter
and checks at the end that the count came back to where it started; a parse that begins while
another is building its tree moves the count, and the first raises ``SystemError: AST
constructor recursion depth mismatch``. In a test process that happens: the garbage collector
runs in the middle of a parse (building the tree allocates), finds a socket an earlier test left
unclosed, and pytest's hook formats its warning, parsing each line of the traceback for the
carets; in the same thread, or in another of the process's threads at the same moment. A fresh
interpreter holds no one else's garbage or threads; its trees come back pickled.
"""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path

_PARSE = """
import ast, pickle, sys
try:
    trees = [ast.parse(text, filename=name) for name, text in pickle.load(sys.stdin.buffer)]
except SyntaxError as error:
    sys.exit(f"{error.filename}:{error.lineno}: {error.msg}")
pickle.dump(trees, sys.stdout.buffer)
"""


def parse_apart(sources: Mapping[str, str]) -> dict[str, ast.Module]:
    """Each source (by the name its errors would give) parsed in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", _PARSE],
        input=pickle.dumps(list(sources.items())),
        capture_output=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"parsing failed: {done.stderr.decode(errors='replace').strip()}")
    trees: list[ast.Module] = pickle.loads(done.stdout)
    return dict(zip(sources, trees, strict=True))


@cache
def trees_under(folder: Path) -> dict[Path, ast.Module]:
    """Every ``*.py`` file under ``folder``, in order, with its tree (parsed once a session)."""
    paths = {str(path): path for path in sorted(folder.rglob("*.py"))}
    trees = parse_apart({name: path.read_text() for name, path in paths.items()})
    return {paths[name]: tree for name, tree in trees.items()}
