"""Fixtures for the reliability tests: fleets of their own, and the report every test feeds."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from api.local.stack import LocalStack
from tests.conftest import REPO, Caller, RedisServer, WorkerFleet, fleet_settings
from tests.reliability.report import Outcome, Report, Row, machine_header
from worker.contract.settings import WorkerSettings

#: The committed copy, refreshed by `make reliability-report`; `make test` leaves it alone.
COMMITTED_REPORT = REPO / "docs" / "RELIABILITY.md"
#: Where a run writes its report instead of the test output (``make reliability-report``).
REPORT_PATH_VARIABLE = "RELIABILITY_REPORT"
RELIABILITY_DIR = "tests/reliability/"
#: The HTTP API's tests, whose bad-input cases the report includes.
HTTP_API_DIR = "tests/api/http/"

#: The HTTP API's bad-input tests (another file's): included in the report as they ran.
HTTP_API_TESTS = {
    "test_every_route_but_health_needs_the_token": (
        "A request without the bearer token, or with a wrong one, on every route but /health",
        "401, nothing run",
    ),
    "test_serve_refuses_a_reachable_address_without_a_token": (
        "`toolq serve` on a non-loopback address without a token",
        "refuses to start",
    ),
    "test_an_invalid_run_is_refused_naming_the_field_and_the_reason": (
        "Invalid run bodies: missing/empty prompt, wrong types, extra fields, "
        "run_id `../etc`, unknown or sandbox tools",
        "422 naming the field and the reason, nothing run",
    ),
    "test_malformed_json_is_refused_with_a_clear_message": (
        "A body that is not JSON",
        "422 'not valid JSON'",
    ),
    "test_a_body_declared_too_large_is_refused_before_it_is_read": (
        "A body larger than TOOLQ_API_MAX_BODY_BYTES",
        "413 before it is read",
    ),
    "test_a_chunked_body_is_cut_off_once_it_passes_the_limit": (
        "A chunked body that never ends",
        "413 once it passes the limit",
    ),
    "test_unknown_runs_and_batches_are_404": (
        "Unknown run and batch ids",
        "404",
    ),
    "test_an_invalid_batch_is_refused_naming_the_field": (
        "Invalid batches: no items, concurrency 0, unknown tools",
        "422 naming the field",
    ),
    "test_items_sharing_an_id_are_refused_naming_the_second": (
        "A batch whose items share an id",
        "409 naming the second item, nothing run",
    ),
    "test_another_tokens_run_is_404_as_an_unknown_one_is": (
        "Tenant B names tenant A's run: GET, events, cancel, its viewer page, its live stream "
        "with a ticket B signed with his own token",
        "404, the same answer as for an unknown id; A's run goes on",
    ),
    "test_another_tokens_batch_is_404_as_an_unknown_one_is": (
        "Tenant B names tenant A's batch: GET, its viewer pages and items, its live stream",
        "404, the same answer as for an unknown id",
    ),
    "test_each_token_lists_its_own_runs_and_batches_and_no_others": (
        "Tenant B lists runs and batches in the viewer",
        "B's own only",
    ),
    "test_two_tenants_choosing_one_run_id_never_share_a_workspace": (
        "Tenant B gives the run_id of tenant A's workspace, on real workers",
        "a workspace of B's own: A's file is not there",
    ),
    "test_a_bad_tokens_file_is_refused_in_one_line": (
        "A TOOLQ_API_TOKENS_FILE with a malformed line, a name or a token twice, a token of "
        "under 16 characters, no tenant",
        "refuses to start, one line naming the line, no token shown",
    ),
}


#: Gaps these tests do not measure, known from elsewhere: (title, why).
KNOWN_GAPS = (
    (
        "A call handed to a worker whose network was cut is lost",
        "a message Redis pops for a worker's waiting BRPOP after its host lost the network is "
        "not yet in kombu's `unacked` hash, so nothing restores it: only the caller's deadline "
        "answers for it (`no_answer`), never a second run. Messages the cut worker had "
        "received come back after the visibility timeout, past their deadline, and are not "
        "run. With RabbitMQ the broker requeues them. Measured in "
        "tests/netns/test_scale_out.py (docs/scale-out.md).",
    ),
    (
        "run_bash without namespaces",
        "where the machine gives no PID and network namespaces (an unprivileged container), "
        "run_bash falls back to process isolation: commands can reach the network, see other "
        "processes, and leftovers are found by the command's control group (or, where no group "
        "can be made either, only by the per-call marker sweep). The container must then be "
        "the isolation. The rows above ran with the layers in the header.",
    ),
    (
        "A call's memory where no control group can be made (the deploy's pools as shipped)",
        "without a writable cgroup tree each of a call's processes is bounded by the address-space "
        "rlimit alone: several processes of one call together may hold more than "
        "TOOLQ_SANDBOX_MEMORY_MB, up to the pod's limit (its SysV shared memory stays bounded "
        "as a whole by the call's IPC namespace). Every answer's `isolation` names "
        "`memory-per-process-only` and `toolq status` says `per process only`; given a delegated "
        "group, the pool's calls are bounded each (tests/reliability/test_uid_handover.py, "
        "`deploy-delegated`).",
    ),
    (
        "The workspace quota is accounting, not a hard bound",
        "a run's workspace is measured after each call that can write to it "
        "(TOOLQ_WORKSPACE_QUOTA_BYTES): one call can write past the quota before it is measured "
        "(each file it writes is bounded by TOOLQ_SANDBOX_FILE_SIZE_MB, not their sum), and only "
        "the next calls are refused. A hard bound needs a file system per run or project quotas "
        "on the volume the workspaces share, which the worker does not make.",
    ),
)


class _Observer:
    """Sees every test of the session, this directory's and the HTTP API's, as they end."""

    def __init__(self) -> None:
        self.http_api: dict[str, Outcome] = defaultdict(Outcome)
        #: The file each HTTP API test ran from, to name it in the report.
        self.http_api_files: dict[str, str] = {}
        self.ran: dict[str, int] = defaultdict(int)
        self.collected: set[str] = set()
        self.reported: set[str] = set()
        self.started: float | None = None
        self.written: tuple[Path, str] | None = None

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = {i.nodeid for i in session.items if i.nodeid.startswith(RELIABILITY_DIR)}

    def missing(self) -> str | None:
        """Why this session is not a full run of the reliability tests, or None if it is."""
        here = Path(__file__).parent
        files = {f"{RELIABILITY_DIR}{path.name}" for path in here.glob("test_*.py")}
        absent = files - {nodeid.split("::", 1)[0] for nodeid in self.collected}
        if absent:
            return f"not collected: {', '.join(sorted(absent))}"
        unfinished = self.collected - self.reported
        if unfinished:
            return f"{len(unfinished)} of {len(self.collected)} reliability tests did not run"
        return None

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.written is not None:
            path, why = self.written
            terminalreporter.write_line(f"reliability report: {path}{why}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path, _, name = report.nodeid.partition("::")
        function = name.split("[", 1)[0]
        if path.startswith(RELIABILITY_DIR):
            if report.when == "setup" and self.started is None:
                self.started = time.monotonic()
            if report.when == "call" or (report.when == "setup" and not report.passed):
                kind = "xfailed" if hasattr(report, "wasxfail") else report.outcome
                self.ran[kind] += 1
                self.reported.add(report.nodeid)
        elif path.startswith(HTTP_API_DIR) and function in HTTP_API_TESTS:
            self.http_api_files[function] = path
            outcome = self.http_api[function]
            if report.when == "call" and report.passed:
                outcome.passed += 1
            elif report.failed:
                outcome.failed += 1
            elif report.skipped:
                outcome.skipped += 1


_OBSERVER = _Observer()


def pytest_configure(config: pytest.Config) -> None:
    # A conftest's own hooks see only the tests under it; a registered object sees them all.
    if not config.pluginmanager.is_registered(_OBSERVER):
        config.pluginmanager.register(_OBSERVER, "toolq-reliability-observer")


@pytest.fixture(scope="session")
def report(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Report]:
    """The session's report, written when the last test is done: to the session's temporary
    directory (the test output), or to the path in RELIABILITY_REPORT after a full run of
    the reliability tests."""
    collected = Report()
    yield collected
    _add_http_api_rows(collected)
    for title, why in KNOWN_GAPS:
        collected.gap(title, why)
    ran = ", ".join(f"{n} {kind}" for kind, n in sorted(_OBSERVER.ran.items()))
    missing = _OBSERVER.missing()
    if missing:
        ran += f"; partial run, {missing}"
    args = " ".join(pytestconfig.invocation_params.args) or "(the whole suite)"
    started = _OBSERVER.started or time.monotonic()
    header = machine_header(f"pytest {args}", time.monotonic() - started, f"tests: {ran}")
    chosen = os.environ.get(REPORT_PATH_VARIABLE)
    if chosen and not missing:
        path = Path(chosen).absolute()
    else:
        path = tmp_path_factory.getbasetemp() / COMMITTED_REPORT.name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(collected.render(header))
    _OBSERVER.written = (path, f" (partial run: {missing})" if missing else "")


def _add_http_api_rows(collected: Report) -> None:
    for function, (case, expected) in HTTP_API_TESTS.items():
        outcome = _OBSERVER.http_api.get(function)
        where = f"`{_OBSERVER.http_api_files.get(function, HTTP_API_DIR)}::{function}`"
        row = Row("HTTP API bad input", case, expected)
        if outcome is None or outcome.passed + outcome.failed == 0:
            row.observed = f"covered by {where}; not run in this session"
        else:
            row.observed = f"{where}: {outcome.passed} passed, {outcome.failed} failed"
            row.passed = outcome.failed == 0
        collected.rows.append(row)


# --- Fleets of the tests' own --------------------------------------------------------------------


@dataclass
class Stack:
    """A private redis-server, a fleet of both pools on it, and optional extra tools workers."""

    redis: RedisServer
    fleet: WorkerFleet
    extra: list[LocalStack] = field(default_factory=list)

    @property
    def settings(self) -> WorkerSettings:
        return self.fleet.settings

    @property
    def workspace_root(self) -> Path:
        return Path(self.settings.workspace_root)

    def stop(self) -> None:
        for stack in self.extra:
            stack.stop()
        self.fleet.stop()
        self.redis.stop()


@dataclass
class Run:
    """One run's calls through a stack's queue."""

    caller: Caller
    stack: Stack

    async def bash(self, command: str, timeout_ms: int = 15_000) -> dict[str, Any]:
        """What ``command`` printed and returned, as run_bash answers; a failed call fails the
        test."""
        result = await self.caller("run_bash", {"command": command, "timeout": timeout_ms})
        assert not result.is_error, result.output
        answer: dict[str, Any] = json.loads(result.output)
        return answer

    @property
    def workspace(self) -> Path:
        return self.stack.workspace_root / self.caller.run_id


def start_stack(
    workdir: Path,
    *,
    workspace_root: Path | None = None,
    extra_tools_workers: int = 0,
    env: dict[str, str] | None = None,
    redis_password: str | None = None,
    redis_appendonly: bool = False,
    **overrides: object,
) -> Stack:
    """Everything started, or nothing left running."""
    workdir.mkdir(parents=True, exist_ok=True)
    root = workspace_root or workdir / "workspaces"
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    server = RedisServer(workdir, password=redis_password, appendonly=redis_appendonly)
    server.start()
    settings = fleet_settings(server.url, root, **overrides)
    fleet = WorkerFleet(settings)
    stack = Stack(server, fleet)
    try:
        with variables_set(env or {}):
            fleet.start()
            for _ in range(extra_tools_workers):
                extra = LocalStack(settings, pools=("tools",))
                stack.extra.append(extra)
                extra.start_workers(settings)
    except BaseException:
        stack.stop()
        raise
    return stack


@contextlib.contextmanager
def variables_set(values: dict[str, str]) -> Iterator[None]:
    """Variables the processes started inside inherit; the test process gets its own back."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# --- Processes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    argv: tuple[str, ...]


def processes() -> dict[int, Process]:
    """Every process on the machine now, by pid (those that vanish while read are left out)."""
    found: dict[int, Process] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{entry.path}/stat", "rb") as stat:
                ppid = int(stat.read().rsplit(b")", 1)[1].split()[1])
            with open(f"{entry.path}/cmdline", "rb") as cmdline:
                argv = tuple(a.decode(errors="replace") for a in cmdline.read().split(b"\0") if a)
        except (OSError, IndexError, ValueError):
            continue
        found[int(entry.name)] = Process(int(entry.name), ppid, argv)
    return found


def find_process(argv: tuple[str, ...]) -> list[int]:
    """Pids of live processes started with exactly ``argv``."""
    return [p.pid for p in processes().values() if p.argv == argv]


def pids_with(marker: str) -> list[int]:
    """Pids of the processes whose command line holds ``marker``."""
    return [p.pid for p in processes().values() if marker in " ".join(p.argv)]


def ancestors(pid: int) -> list[int]:
    """``pid``, its parent, and so on up to init."""
    table = processes()
    chain = []
    while pid in table and pid > 1:
        chain.append(pid)
        pid = table[pid].ppid
    return chain


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False
