"""What the site's pages are filled with when it is built: a page asks for a generated part with
a line ``<!-- generated: NAME -->``, replaced by that part (an HTML comment, so the page's source
on its own says where its content comes from)."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH_REPORT = REPO / "bench" / "results" / "latest.md"

PLACEHOLDER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def cli_reference() -> str:
    from api.cli import app
    from docsgen import cli

    return cli.markdown(app)


def settings_reference() -> str:
    from docsgen import settings

    return settings.markdown()


def http_reference() -> str:
    from docsgen import http

    return http.markdown(http.build_app())


def benchmark_report() -> str:
    """The latest run of ``make bench`` without its title, its sections one level down."""
    lines = BENCH_REPORT.read_text().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join(f"#{line}" if line.startswith("#") else line for line in lines)


def bench_pictures() -> list[Path]:
    """The benchmark report's pictures, beside it, which it shows by their names."""
    return sorted(BENCH_REPORT.parent.glob("*.png"))


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_reference,
    "settings": settings_reference,
    "http": http_reference,
    "benchmarks": benchmark_report,
}


@cache
def generated(name: str) -> str:
    try:
        make = GENERATORS[name]
    except KeyError:
        raise ValueError(
            f"no generated part named {name!r} (parts: {', '.join(GENERATORS)})"
        ) from None
    return make()


def fill(markdown: str) -> str:
    """``markdown`` with each placeholder replaced by its part."""
    return PLACEHOLDER.sub(lambda found: generated(found[1]), markdown)
