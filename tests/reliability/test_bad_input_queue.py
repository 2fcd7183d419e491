"""Hostile input through the queue: real workers, real Redis, calls sent by the dispatcher.

The workspace is ``<top>/outer/base/ws``; next to it, a sentinel folder with a canary and files
named like the corpus's targets (etc/passwd, boot.ini). No call may read, write, list, move or
remove anything outside the workspace, and no answer may show the canary's secret or a name that
exists only outside.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from api.calls.dispatch import Dispatcher
from tests.conftest import REPO, Caller
from tests.reliability.conftest import Stack, start_stack
from tests.reliability.report import Counts, Report, Row
from tests.traversal import NUL_PATH_CALLS, calls_naming, outside_targets
from tests.worker.tools.conftest import MARKER, SECRET, Layout, make_layout
from worker.contract.wire import ToolCallResult

pytestmark = pytest.mark.integration

CORPUS = REPO.parent / "shared" / "corpus" / "path-traversal"
BIG_FILE = "PATT_dotdotpwn.txt"
#: The corpus's placeholder for "the file to steal": here, the canary next to the workspace.
PLACEHOLDER_TARGET = "sentinel/canary.txt"
RUN_ID = "ws"
#: Seconds the corpus may take through the queue, the throughput measurement included.
CORPUS_BUDGET_S = 36.0
#: Sample strides tried, densest first: every n-th payload of a file.
STRIDES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100, 150, 200, 300)
#: The big file repeats a few patterns over four targets and eight depths: sampled more thinly.
BIG_FILE_THINNING = 10
IN_FLIGHT = 128
#: Writes, moves and searches cost more than the reads the throughput is measured with.
MIXED_SPEED = 0.85
#: Send every payload to every tool, however long it takes (a long run, not `make test`).
FULL_CORPUS = os.environ.get("RELIABILITY_FULL_CORPUS") == "1"
NOT_ANSWERED = ("no_answer", "broker_unavailable")
#: What the tools pool may read besides the file a case is about (its messages, its imports):
#: far below the gigabytes of the big files it must not read.
READ_ALLOWANCE_BYTES = 64 * 1024**2


@dataclass
class Fixture:
    stack: Stack
    layout: Layout

    @property
    def workspace(self) -> Path:
        return self.layout.workspace_dir


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    """A fleet whose workspace root is the layout's base: run ``ws`` works in the workspace."""
    layout = make_layout(tmp_path_factory.mktemp("bad-input"))
    stack = start_stack(
        tmp_path_factory.mktemp("bad-input-stack"),
        workspace_root=layout.base,
        extra_tools_workers=1,
    )
    yield Fixture(stack, layout)
    stack.stop()


@pytest.fixture
async def call(bad: Fixture) -> AsyncIterator[Caller]:
    async with Dispatcher(bad.stack.settings) as dispatcher:
        yield Caller(dispatcher, bad.stack.settings, RUN_ID)


class Probe:
    """Sends calls, counts what came back, and checks no answer shows what lies outside."""

    def __init__(self, call: Caller, stack: Stack | None = None) -> None:
        self._call = call
        self._stack = stack
        self.counts = Counts()
        self.refused = 0
        self.leaks: list[tuple[str, Any]] = []

    async def __call__(
        self, tool: str, arguments: dict[str, Any] | str, timeout_ms: int | None = None
    ) -> ToolCallResult:
        self.counts.sent += 1
        result = await self._call(tool, arguments, timeout_ms=timeout_ms)
        if result.error_kind in NOT_ANSWERED:
            self.counts.lost += 1
        else:
            self.counts.answered += 1
            self.refused += result.is_error
        if SECRET in result.output or MARKER in result.output:
            self.leaks.append((tool, arguments))
        return result

    @property
    def longest_timeout_ms(self) -> int:
        return self._call.settings.max_timeout_ms

    def read_by_tools_pool(self) -> int:
        """Bytes the tools pool's processes (each worker and its children) have read so far, as
        the kernel counts them: what a call read, whatever the time it took on a busy machine."""
        if self._stack is None:
            raise ValueError("this probe was made without its stack")
        pids = [
            *self._stack.fleet.worker_pids("tools"),
            *(pid for extra in self._stack.extra for pid in extra.pids("worker-tools")),
        ]
        return sum(_bytes_read(pid) for pid in pids)


def _bytes_read(pid: int) -> int:
    """``rchar`` of ``pid``: what it read through system calls, 0 once it is gone."""
    try:
        lines = Path(f"/proc/{pid}/io").read_text().splitlines()
    except OSError:
        return 0
    return next(int(line.split()[1]) for line in lines if line.startswith("rchar:"))


# --- The traversal corpus ------------------------------------------------------------------------


@cache
def corpus() -> dict[str, tuple[str, ...]]:
    """Each corpus file's payloads, every payload once (in the first file that has it)."""
    seen: set[str] = set()
    files: dict[str, tuple[str, ...]] = {}
    for path in sorted(CORPUS.glob("PATT_*.txt")):
        lines = []
        for line in path.read_text(encoding="utf-8").split("\n"):
            payload = line.rstrip("\r").replace("{FILE}", PLACEHOLDER_TARGET)
            if payload not in seen:
                seen.add(payload)
                lines.append(payload)
        files[path.name] = tuple(lines)
    return files


def sample(stride: int) -> list[str]:
    """Every ``stride``-th payload of the small files and every ``stride * BIG_FILE_THINNING``-th
    of the big one: deterministic, and every file represented."""
    return [
        p
        for name, payloads in corpus().items()
        for p in payloads[:: stride * (BIG_FILE_THINNING if name == BIG_FILE else 1)]
    ]


def small_files() -> list[str]:
    return [p for name, payloads in corpus().items() if name != BIG_FILE for p in payloads]


Arguments = Callable[[str, int], dict[str, Any]]

#: Every way a path reaches a tool: (tool, arguments for payload number n).
PATH_CASES: dict[str, tuple[str, Arguments]] = {
    "read_file": ("read_file", lambda p, n: {"path": p}),
    "write_file": ("write_file", lambda p, n: {"path": p, "content": "written by a payload"}),
    "list_dir": ("list_dir", lambda p, n: {"path": p}),
    "mkdir": ("mkdir", lambda p, n: {"path": p}),
    "remove": ("remove", lambda p, n: {"path": p}),
    "move source": ("move", lambda p, n: {"source": p, "destination": "moved-here"}),
    "move destination": ("move", lambda p, n: {"source": f"victims/{n}.txt", "destination": p}),
    "search_text": ("search_text", lambda p, n: {"query": SECRET[:13], "paths": [p]}),
    "search_files pattern": ("search_files", lambda p, n: {"pattern": p}),
    "search_files path": ("search_files", lambda p, n: {"pattern": "**", "path": p}),
}


@dataclass
class Plan:
    """Which payloads each case gets, chosen from the throughput measured first."""

    read_stride: int
    other_stride: int

    @classmethod
    def for_rate(cls, calls_per_s: float, seconds: float) -> Plan:
        if FULL_CORPUS:
            return cls(1, 1)
        capacity = calls_per_s * seconds * MIXED_SPEED
        big = len(corpus()[BIG_FILE])
        # Half of what is left finishes read_file (the small files were sent while measuring).
        read = next((s for s in STRIDES if math.ceil(big / s) <= capacity / 2), STRIDES[-1])
        others = len(PATH_CASES) - 1
        other = next((s for s in STRIDES if len(sample(s)) * others <= capacity / 2), STRIDES[-1])
        return cls(read, other)


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"the traversal corpus is missing at {CORPUS}")
async def test_no_traversal_payload_reaches_outside_the_workspace(
    bad: Fixture, call: Caller, report: Report
) -> None:
    workspace = bad.workspace
    # The run's first call makes its workspace ready (its uid claimed, the root closed to
    # listing): the worker's own state, changed before anything is compared.
    await call("list_dir", {"path": "."})
    (workspace / "notes.txt").write_text("inside the workspace\n")
    with contextlib.suppress(FileExistsError):
        (workspace / "out").symlink_to(bad.layout.sentinel)
    everything = [p for payloads in corpus().values() for p in payloads]
    outside_before = outside_targets(workspace, everything)
    before = bad.layout.snapshot()
    probes = {case: Probe(call) for case in PATH_CASES}
    limit = asyncio.Semaphore(IN_FLIGHT)

    async def send(case: str, payload: str, n: int) -> None:
        tool, arguments = PATH_CASES[case]
        async with limit:
            await probes[case](tool, arguments(payload, n))

    # Measure while doing useful work: read_file over the two small files.
    started = time.monotonic()
    first = small_files()
    await asyncio.gather(*(send("read_file", p, n) for n, p in enumerate(first)))
    measured_s = time.monotonic() - started
    rate = len(first) / measured_s
    plan = Plan.for_rate(rate, CORPUS_BUDGET_S - measured_s)

    read_rest = list(corpus()[BIG_FILE][:: plan.read_stride])
    others = sample(plan.other_stride)
    victims = workspace / "victims"
    victims.mkdir(exist_ok=True)
    for n in range(len(others)):
        (victims / f"{n}.txt").write_text("moved by a payload\n")
    sends = [send("read_file", p, n) for n, p in enumerate(read_rest)]
    for case in PATH_CASES:
        if case != "read_file":
            sends += [send(case, p, n) for n, p in enumerate(others)]
    await asyncio.gather(*sends)
    elapsed = time.monotonic() - started

    total = sum(len(ps) for ps in corpus().values())
    report.note(
        f"Traversal corpus through the queue: {total:,} distinct payloads in "
        f"{len(corpus())} files; measured {rate:.0f} calls/s (read_file over the two small "
        f"files), so read_file got {len(first) + len(read_rest):,} payloads (the small files "
        f"whole, every {_nth(plan.read_stride)} line of {BIG_FILE}) and each other case "
        f"{len(others):,} (every {_nth(plan.other_stride)} line of the small files, every "
        f"{_nth(plan.other_stride * BIG_FILE_THINNING)} of {BIG_FILE}); "
        f"{sum(p.counts.sent for p in probes.values()):,} calls in {elapsed:.0f} s, "
        f"{IN_FLIGHT} in flight. Set RELIABILITY_FULL_CORPUS=1 to send every payload to every "
        "case."
    )
    if plan.read_stride > 1 or plan.other_stride > 1:
        full_calls = total * len(PATH_CASES)
        report.gap(
            "The whole traversal corpus does not go through the queue in `make test`",
            f"at {rate:.0f} calls/s all {total:,} payloads for all {len(PATH_CASES)} cases "
            f"({full_calls:,} calls) would take about {full_calls / rate / 60:.0f} minutes, so "
            "the queue test sends the sample in the notes; every payload against every tool "
            "runs in-process in tests/worker/tools/test_traversal.py (same tools, same workspace "
            "checks), and RELIABILITY_FULL_CORPUS=1 sends the whole corpus through the queue.",
        )
    for case, probe in probes.items():
        with report.case(
            "Bad input",
            f"Traversal corpus via {case} ({probe.counts.sent:,} payloads)",
            "nothing outside the workspace read, written, listed, moved or removed; "
            "no answer shows the canary",
        ) as row:
            row.counts = probe.counts
            row.observed = (
                f"{probe.refused:,} refused, {probe.counts.answered - probe.refused:,} acted "
                f"inside the workspace; {len(probe.leaks)} showed the canary"
            )
            assert not probe.leaks, probe.leaks[:5]
            assert probe.counts.lost == 0
    with report.case(
        "Bad input",
        "Traversal corpus: the tree around the workspace after every case",
        "unchanged: type, size, mtime and content of every file; no path a payload names "
        "outside appears or changes",
    ) as row:
        after = bad.layout.snapshot()
        changed = sorted(set(before.items()) ^ set(after.items()))
        moved_outside = outside_targets(workspace, everything) != outside_before
        row.observed = f"{len(changed)} entries changed; outside paths changed: {moved_outside}"
        assert not changed, changed[:5]
        assert not moved_outside
        assert (workspace / "out").resolve() == bad.layout.sentinel


def _nth(n: int) -> str:
    return {1: "", 2: "2nd", 3: "3rd"}.get(n, f"{n}th").strip() or "single"


# --- Nasty cases ---------------------------------------------------------------------------------


#: A case gets the folder it works in, and that folder relative to the workspace.
Case = Callable[[Probe, Path, str, Row], Awaitable[None]]
NASTY: dict[str, tuple[str, Case]] = {}


def nasty(title: str, expected: str) -> Callable[[Case], Case]:
    def register(case: Case) -> Case:
        NASTY[title] = (expected, case)
        return case

    return register


@nasty(
    "`/proc/self/environ`, as a path and through a link in the workspace",
    "refused as outside the workspace; no variable of the worker shown",
)
async def _proc_environ(probe: Probe, here: Path, rel: str, row: Row) -> None:
    (here / "environ").symlink_to("/proc/self/environ")
    answers = [
        await probe("read_file", {"path": "/proc/self/environ"}),
        await probe("read_file", {"path": f"{rel}/environ"}),
        await probe("search_text", {"query": "TOOLQ", "paths": [f"{rel}/environ"]}),
    ]
    row.observed = answers[1].output[:90]
    assert all("outside the workspace" in a.output for a in answers), answers
    assert not any("TOOLQ_BROKER_URL" in a.output or "PATH=" in a.output for a in answers)


@nasty("`/dev/zero`, as a path and through a link", "refused at once, nothing read")
async def _dev_zero(probe: Probe, here: Path, rel: str, row: Row) -> None:
    (here / "zero").symlink_to("/dev/zero")
    read_before = probe.read_by_tools_pool()
    started = time.monotonic()
    answers = [
        await probe("read_file", {"path": "/dev/zero"}),
        await probe("read_file", {"path": f"{rel}/zero"}),
        await probe("search_text", {"query": "x", "paths": [f"{rel}/zero"]}),
    ]
    elapsed = time.monotonic() - started
    read = probe.read_by_tools_pool() - read_before
    row.observed = f"refused in {elapsed:.2f} s, {read:,} bytes read: {answers[1].output[:70]}"
    assert all("outside the workspace" in a.output for a in answers), answers
    assert read < READ_ALLOWANCE_BYTES


@nasty("A FIFO in the workspace: read_file, write_file, search_text", "refused without blocking")
async def _fifo(probe: Probe, here: Path, rel: str, row: Row) -> None:
    os.mkfifo(here / "pipe")
    read = await probe("read_file", {"path": f"{rel}/pipe"})
    written = await probe("write_file", {"path": f"{rel}/pipe", "content": "x"})
    searched = await probe("search_text", {"query": "x", "paths": [f"{rel}/pipe"]})
    row.observed = read.output[:100]
    assert "is a named pipe (FIFO), not a regular file" in read.output
    assert "is a named pipe (FIFO); write_file only writes regular files" in written.output
    assert "named pipe" in searched.output, searched.output


@nasty(
    "A 5 GB sparse file (text, then zeros) and a 5 GB all-zero file",
    "answered without reading them (the tools pool reads under 64 MiB): the first 50 KB and "
    "the full size, or 'binary file'",
)
async def _sparse(probe: Probe, here: Path, rel: str, row: Row) -> None:
    with (here / "sparse.txt").open("wb") as file:
        file.write(b"header line\n" * 1000)
        file.truncate(5 * 1024**3)
    (here / "zeros.bin").open("wb").truncate(5 * 1024**3)
    read_before = probe.read_by_tools_pool()
    started = time.monotonic()
    text = await probe("read_file", {"path": f"{rel}/sparse.txt"})
    text_s = time.monotonic() - started
    zeros = await probe("read_file", {"path": f"{rel}/zeros.bin"})
    zeros_s = time.monotonic() - started - text_s
    read = probe.read_by_tools_pool() - read_before
    row.observed = (
        f"{text_s:.2f} s and {zeros_s:.2f} s, {read:,} bytes read by the tools pool; "
        f"{len(text.output.encode()):,} bytes shown"
    )
    assert "sparse.txt has 5,368,709,120 bytes" in text.output
    assert len(text.output.encode()) <= 51_200
    assert "is a binary file (5,368,709,120 bytes)" in zeros.output
    assert read < READ_ALLOWANCE_BYTES


@nasty(
    "Bytes that are not UTF-8: a Latin-1 file, a name with byte 0xE9, a lone surrogate",
    "the encoding and offset named; the name shown escaped; the surrogate refused",
)
async def _not_utf8(probe: Probe, here: Path, rel: str, row: Row) -> None:
    (here / "latin.txt").write_bytes("café au lait\n".encode("latin-1"))
    with open(os.path.join(os.fsencode(here), b"latin-\xe9.txt"), "wb") as file:
        file.write(b"x")
    read = await probe("read_file", {"path": f"{rel}/latin.txt"})
    listing = await probe("list_dir", {"path": rel})
    # Raw JSON: a lone surrogate cannot be sent any other way.
    raw = json.dumps({"path": f"{rel}/s.txt", "content": "ab\ud800"})
    surrogate = await probe("write_file", raw)
    row.observed = read.output[read.output.find("not valid utf-8") :][:100]
    assert "not valid utf-8 text: byte 0xe9 at offset 3" in read.output
    assert "latin-\\xe9.txt" in listing.output
    assert "unpaired surrogate" in surrogate.output
    assert not (here / "s.txt").exists()


@nasty("A NUL byte in a path, for every path tool", "refused: 'contains a NUL byte'")
async def _nul(probe: Probe, here: Path, rel: str, row: Row) -> None:
    answers = [await probe(tool, args) for tool, args in NUL_PATH_CALLS]
    refused = sum("contains a NUL byte" in a.output for a in answers)
    row.observed = f"{refused}/{len(answers)} refused naming the NUL byte"
    assert refused == len(answers), [a.output for a in answers]


@nasty("300-character names", "refused: 'too long (at most 255 bytes per name)'")
async def _long_names(probe: Probe, here: Path, rel: str, row: Row) -> None:
    answers = [await probe(tool, args) for tool, args in calls_naming(f"{rel}/" + "n" * 300)]
    refused = sum("is too long (at most 255 bytes per name" in a.output for a in answers)
    row.observed = f"{refused}/{len(answers)} refused naming the limit"
    assert refused == len(answers), [a.output for a in answers]


@nasty(
    "Catastrophic regex `(a+)+$` over 5,000 a's (search_text)",
    "cut at the search's 5 s budget and answered saying so, not at the call's deadline",
)
async def _catastrophic_regex(probe: Probe, here: Path, rel: str, row: Row) -> None:
    (here / "evil.txt").write_text("a" * 5000 + "!\n")
    started = time.monotonic()
    # The longest deadline the fleet allows: a call that waited in the queue on a busy machine
    # still has the whole budget to run.
    answer = await probe(
        "search_text",
        {"query": "(a+)+$", "paths": [f"{rel}/evil.txt"], "regex": True},
        timeout_ms=probe.longest_timeout_ms,
    )
    elapsed = time.monotonic() - started
    row.observed = f"answered in {elapsed:.1f} s: {answer.output[:80]}"
    # Uncut, the match takes time exponential in the a's: only the budget's cut says this.
    assert "search stopped after its 5 s time limit" in answer.output
    assert not answer.is_error, answer.output


@nasty(
    "Wrong types, missing and extra fields, arguments that are not an object or not JSON",
    "'invalid arguments' naming the parameter; nothing run",
)
async def _wrong_arguments(probe: Probe, here: Path, rel: str, row: Row) -> None:
    cases: list[tuple[str, dict[str, Any] | str, str]] = [
        ("read_file", {"path": 7}, "'path': Input should be a valid string"),
        ("read_file", {}, "'path': Field required"),
        ("read_file", {"path": "a", "mode": "rb"}, "'mode': unknown parameter"),
        ("write_file", {"path": f"{rel}/a", "content": ["x"]}, "'content': Input should be"),
        ("search_text", {"query": "x", "paths": [1]}, "'paths.0': Input should be a valid str"),
        ("search_text", {"query": "x", "paths": ".", "regex": "maybe"}, "'regex': Input should"),
        ("read_file", "[1, 2]", "expected a JSON object"),
        ("read_file", '{"path": ', "not valid JSON"),
    ]
    named = 0
    for tool, args, message in cases:
        answer = await probe(tool, args)
        named += answer.error_kind == "invalid_arguments" and message in answer.output
    row.observed = f"{named}/{len(cases)} refused naming the problem"
    assert named == len(cases)
    assert not (here / "a").exists()


@nasty(
    "Names that look like options: `-rf`, `--help`",
    "plain names: written, read and removed; nothing else touched",
)
async def _option_names(probe: Probe, here: Path, rel: str, row: Row) -> None:
    (here / "keep.txt").write_text("kept")
    written = await probe("write_file", {"path": f"{rel}/-rf", "content": "x"})
    help_dir = await probe("mkdir", {"path": f"{rel}/--help"})
    removed = await probe("remove", {"path": f"{rel}/-rf"})
    removed_dir = await probe("remove", {"path": f"{rel}/--help"})
    row.observed = f"{removed.output} / {removed_dir.output}"
    assert not written.is_error and not help_dir.is_error
    assert removed.output == f"Removed {rel}/-rf."
    assert sorted(p.name for p in here.iterdir()) == ["keep.txt"]


@nasty(
    "remove of the workspace root: `.`, `` (empty), `/`, `./`, `a/..`, its absolute path",
    "refused; the workspace keeps its content",
)
async def _remove_root(probe: Probe, here: Path, rel: str, row: Row) -> None:
    (here / "keep.txt").write_text("kept")
    workspace = here.parent.parent
    paths = [".", "", "/", "./", "nasty/..", str(workspace), str(workspace) + "/"]
    answers = [await probe("remove", {"path": path}) for path in paths]
    refused = sum(a.output.startswith("Error executing remove:") for a in answers)
    row.observed = f"{refused}/{len(paths)} refused; {answers[0].output[:70]}"
    assert refused == len(paths), [a.output for a in answers]
    assert (here / "keep.txt").read_text() == "kept"


@nasty("Moving a directory into itself", "refused: 'cannot move directory … into itself'")
async def _move_into_itself(probe: Probe, here: Path, rel: str, row: Row) -> None:
    (here / "dir" / "sub").mkdir(parents=True)
    answers = [
        await probe("move", {"source": f"{rel}/dir", "destination": f"{rel}/dir/sub"}),
        await probe("move", {"source": f"{rel}/dir", "destination": f"{rel}/dir/new"}),
    ]
    row.observed = answers[0].output[:100]
    assert all("into itself" in a.output for a in answers), [a.output for a in answers]
    assert (here / "dir" / "sub").is_dir()


@nasty(
    "Unicode look-alike dots (U+2024, U+FF0E, U+2025, '.' + U+200B) as `../`",
    "plain names inside the workspace; the canary outside untouched",
)
async def _lookalike_dots(probe: Probe, here: Path, rel: str, row: Row) -> None:
    written = 0
    for dots in ("\u2024\u2024", "\uff0e\uff0e", "\u2025", ".\u200b."):
        path = f"{rel}/{dots}/{dots}/{dots}/sentinel/canary.txt"
        answer = await probe("write_file", {"path": path, "content": "inside"})
        written += answer.output.startswith("Wrote 6 bytes")
        assert (here.parent.parent / path).read_text() == "inside"
        assert (await probe("read_file", {"path": path})).output == "inside"
    row.observed = f"{written}/4 written as names inside the workspace"
    assert written == 4


@pytest.mark.parametrize("title", list(NASTY))
async def test_a_nasty_input_through_the_queue(
    title: str, bad: Fixture, call: Caller, report: Report
) -> None:
    expected, case = NASTY[title]
    rel = f"nasty/{case.__name__.lstrip('_')}"
    here = bad.workspace / rel
    here.mkdir(parents=True)
    # The run's first call makes what the fleet keeps for it beside the workspace (its uid's
    # claim, the root closed to listing): made before the snapshot, whichever case runs first.
    assert not (await call("list_dir", {"path": "."})).is_error
    before = bad.layout.snapshot()
    probe = Probe(call, bad.stack)
    try:
        with report.case("Bad input", title, expected) as row:
            try:
                await case(probe, here, rel, row)
            finally:
                row.counts = probe.counts
            assert not probe.leaks, probe.leaks
            assert probe.counts.lost == 0
            assert bad.layout.snapshot() == before, "something outside the workspace changed"
    finally:
        shutil.rmtree(here, ignore_errors=True)


async def test_a_symlink_swapped_between_check_and_use_never_leads_outside(
    bad: Fixture, call: Caller, report: Report
) -> None:
    rounds = 100
    with report.case(
        "Bad input",
        f"A directory swapped for a symlink to the sentinel while {rounds} read_file, "
        f"{rounds} write_file and {rounds} list_dir calls go through it",
        "no answer shows the sentinel's files; nothing outside changes",
    ) as row:
        race = bad.workspace / "race"
        sub = race / "sub"
        sub.mkdir(parents=True)
        (sub / "secret.txt").write_text("inside\n")
        parked = race / "parked"
        stop = threading.Event()
        swaps = 0

        def swapper() -> None:
            nonlocal swaps
            while not stop.is_set():
                try:
                    sub.rename(parked)
                    sub.symlink_to(bad.layout.sentinel)
                    sub.unlink()
                    parked.rename(sub)
                    swaps += 1
                except OSError:
                    _put_back(sub, parked)

        before = bad.layout.snapshot()
        probe = Probe(call)
        racer = threading.Thread(target=swapper, name="swapper")
        racer.start()
        try:
            await asyncio.gather(
                *(
                    probe(tool, args)
                    for _ in range(rounds)
                    for tool, args in (
                        ("read_file", {"path": "race/sub/secret.txt"}),
                        ("write_file", {"path": "race/sub/secret.txt", "content": "tool\n"}),
                        ("list_dir", {"path": "race/sub"}),
                    )
                )
            )
        finally:
            stop.set()
            racer.join(timeout=10)
        _put_back(sub, parked)
        row.counts = probe.counts
        row.observed = f"{swaps:,} swaps during the calls; {len(probe.leaks)} answers leaked"
        assert swaps > 0
        assert not probe.leaks
        assert bad.layout.snapshot() == before
    shutil.rmtree(race, ignore_errors=True)


def _put_back(sub: Path, parked: Path) -> None:
    with contextlib.suppress(OSError):
        if sub.is_symlink():
            sub.unlink()
        elif parked.exists() and sub.exists():
            shutil.rmtree(sub)
        if parked.exists():
            parked.rename(sub)
