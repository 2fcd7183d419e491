"""The README is the repository's front page: it starts with the two commands that set up a
fresh machine, stays short, and sends the reader to the documentation pages that exist."""

from __future__ import annotations

import re

from tests.docs.blocks import REPO, blocks

README = REPO / "README.md"
#: Longer than this, and the README is a manual again: the detail belongs in docs/.
MOST_LINES = 160


def test_the_readme_starts_with_make_demo_and_make_test() -> None:
    text = README.read_text()
    before_first_block = text.split("```", 1)[0]
    assert before_first_block.lstrip().startswith("# toolq\n")
    assert not re.search(r"^[^#<\s]", before_first_block, re.MULTILINE), before_first_block
    commands = [line.split("#", 1)[0].strip() for line in blocks(README)[0].code.splitlines()]
    assert commands == ["make demo", "make test"]


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= MOST_LINES


def test_every_page_the_readme_links_to_exists() -> None:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text()):
        if not target.startswith(("http://", "https://")):
            assert (REPO / target).exists(), target


def test_the_readme_and_the_home_page_name_every_debian_package_make_test_installs() -> None:
    makefile = (REPO / "Makefile").read_text()
    listed = re.search(r"^SYSTEM_PACKAGES := (.*?)(?<!\\)$", makefile, re.MULTILINE | re.DOTALL)
    assert listed is not None
    packages = [pair.split(":", 1)[1] for pair in listed[1].replace("\\", " ").split()]
    assert len(packages) >= 10
    for page in (README, REPO / "docs" / "index.md"):
        prose = " ".join(page.read_text().split())
        missing = [name for name in packages if f"`{name}`" not in prose]
        assert not missing, f"{page.name} does not name {missing}"
