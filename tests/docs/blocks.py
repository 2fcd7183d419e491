"""The code blocks of the documentation (README.md and docs/**/*.md), as the tests run them.

A fenced block's language says what it is: ``python`` and ``sh`` (or ``bash``, ``shell``) are
code, run by the tests; any other (``text``, ``json``, ``yaml``, none) is shown, not run. A
block whose info string has ``title="NAME"`` is a file: the tests write it as NAME in the
page's folder before the page's code runs. A block right after a line
``<!-- not run: REASON -->`` is left alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>.*)$")
TITLE = re.compile(r'title="(?P<title>[^"]+)"')
NOT_RUN = re.compile(r"^\s*<!-- not run: (?P<reason>.+?) -->\s*$")
PYTHON = {"python", "py"}
SHELL = {"sh", "bash", "shell"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    title: str | None
    code: str
    not_run: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def runs(self) -> bool:
        """Code that the tests run, rather than a file they write or a block they skip."""
        return self.not_run is None and self.title is None and self.language in PYTHON | SHELL


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence, info = opening["indent"], opening["fence"], opening["info"].strip()
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        code = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : end]) + "\n"
        title = TITLE.search(info)
        before = next((line for line in reversed(lines[:i]) if line.strip()), "")
        skipped = NOT_RUN.match(before)
        found.append(
            Block(
                page=page,
                line=i + 1,
                language=info.split(" ", 1)[0].lower() if info else "",
                title=title["title"] if title else None,
                code=code,
                not_run=skipped["reason"] if skipped else None,
            )
        )
        i = end + 1
    return found
