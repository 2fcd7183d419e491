"""run_bash through the queue on a real sandbox worker: what a command cannot do.

The worker is started with fake secrets in its environment. A command may not read them, may not
signal or trace the worker, may not exhaust the machine's processes or memory (nor another call's
share of them), may not write past its file-size limit or its run's workspace quota, may not
leave anything running after its call, and may not reach the network where the sandbox has no
network. Every answer says what its command used.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from api.calls.dispatch import Dispatcher
from tests.conftest import Caller, wait_for
from tests.reliability.conftest import Stack, alive, find_process, processes, start_stack
from tests.reliability.report import Counts, Report
from worker.contract.wire import ToolCallResult
from worker.sandbox import LAYER_PID_NS, SandboxConfig, describe_isolation

pytestmark = pytest.mark.integration

SECRETS = {
    "WORKER_TEST_SECRET": f"toolq-test-secret-{secrets.token_hex(8)}",
    "AWS_SECRET_ACCESS_KEY": f"aws-secret-{secrets.token_hex(8)}",
}
FILE_SIZE_MB = 16
QUOTA_MB = 32
MAX_PROCESSES = 256
MEMORY_MB = 1024  # the default TOOLQ_SANDBOX_MEMORY_MB
SANDBOX_USER = "nobody"  # the default TOOLQ_SANDBOX_USER


@pytest.fixture(scope="module")
def sandbox_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A fleet whose workers hold secrets in their environment."""
    stack = start_stack(
        tmp_path_factory.mktemp("isolation"),
        env=SECRETS,
        sandbox_file_size_mb=FILE_SIZE_MB,
        sandbox_max_processes=MAX_PROCESSES,
        workspace_quota_bytes=QUOTA_MB * 2**20,
    )
    yield stack
    stack.stop()


@dataclass
class Bash:
    """run_bash calls through the queue, answered as the JSON the tool returns."""

    caller: Caller
    stack: Stack
    counts: Counts

    async def __call__(self, command: str, timeout_ms: int = 10_000) -> dict[str, Any]:
        result = await self.raw(command, timeout_ms)
        assert not result.is_error, result.output
        answer: dict[str, Any] = json.loads(result.output)
        return answer

    async def raw(
        self, command: str, timeout_ms: int = 10_000, run_id: str | None = None
    ) -> ToolCallResult:
        self.counts.sent += 1
        arguments = {"command": command, "timeout": timeout_ms}
        result = await self.caller("run_bash", arguments, run_id=run_id)
        if result.error_kind in ("no_answer", "broker_unavailable"):
            self.counts.lost += 1
        else:
            self.counts.answered += 1
        return result

    @property
    def workspace(self) -> Path:
        return Path(self.stack.settings.workspace_root) / self.caller.run_id

    def worker_pids(self) -> list[int]:
        """Both pools' main processes and their children."""
        return [*self.stack.fleet.worker_pids("sandbox"), *self.stack.fleet.worker_pids("tools")]


@pytest.fixture
async def bash(sandbox_stack: Stack) -> AsyncIterator[Bash]:
    async with Dispatcher(sandbox_stack.settings) as dispatcher:
        caller = Caller(dispatcher, sandbox_stack.settings, f"run-iso-{secrets.token_hex(4)}")
        yield Bash(caller, sandbox_stack, Counts())


def _layers(stack: Stack) -> list[str]:
    return describe_isolation(SandboxConfig.from_settings(stack.settings))


def _environ(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except ProcessLookupError:  # gone since it was listed
        return ""


async def test_a_command_cannot_read_the_workers_secrets(bash: Bash, report: Report) -> None:
    with report.case(
        "Isolation",
        "run_bash reads the environment: `env`, /proc/self/environ, /proc/<worker pid>/environ "
        "for every worker process, /proc/*/environ",
        "none of the worker's secrets (WORKER_TEST_SECRET, AWS_SECRET_ACCESS_KEY) in the output",
    ) as row:
        pids = bash.worker_pids()
        # The secrets are really there to steal: the worker processes hold them.
        # A pool process may be replaced meanwhile: those still there hold them.
        held = [_environ(pid) for pid in pids if Path(f"/proc/{pid}").exists()]
        assert held and all(SECRETS["AWS_SECRET_ACCESS_KEY"] in environ for environ in held)
        listed = " ".join(map(str, pids))
        answer = await bash(
            "env; cat /proc/self/environ; cat /proc/*/environ; "
            f"for p in {listed}; do cat /proc/$p/environ || echo unreadable $p; done",
        )
        text = answer["stdout"] + answer["stderr"]
        found = [name for name, value in SECRETS.items() if value in text]
        row.counts = bash.counts
        row.observed = (
            f"secrets shown: {found or 'none'}; the environ of {text.count('unreadable ')} of "
            f"{len(pids)} worker processes could not be read"
        )
        assert not found
        assert "TOOLQ_BROKER_URL" not in text


async def test_a_command_cannot_signal_or_trace_the_worker(bash: Bash, report: Report) -> None:
    with report.case(
        "Isolation",
        "run_bash signals and traces the worker: `kill -9` every worker pid, `strace -p`, "
        "`kill -9 -1`",
        "every attempt fails; every worker process lives on and the pool keeps serving",
    ) as row:
        pids = bash.worker_pids()
        mains = [bash.stack.fleet.worker_pids(pool)[0] for pool in ("sandbox", "tools")]
        listed = " ".join(map(str, pids))
        # Without a PID namespace, kill -1 would reach every process of the sandbox user.
        everything = "; kill -9 -1" if LAYER_PID_NS in _layers(bash.stack) else ""
        answer = await bash(
            f"for p in {listed}; do kill -9 $p 2>&1 && echo killed $p; "
            f"timeout 2 strace -p $p -e trace=none 2>&1 | head -1; done{everything}",
        )
        killed = re.findall(r"^killed (\d+)$", answer["stdout"], re.MULTILINE)
        survivors = [pid for pid in pids if alive(pid)]
        after = await bash("echo still serving")
        row.counts = bash.counts
        lines = answer["stdout"].splitlines()
        said = sorted({re.sub(r"\d+", "N", line).strip() for line in lines if line.strip()})
        row.observed = (
            f"{len(survivors)}/{len(pids)} worker processes alive; the command was told: "
            f"{' / '.join(said)[:160]}; the next call was served"
        )
        # Each kill and trace failed, as the command was told. A pool process that is gone all
        # the same was replaced by its pool meanwhile, not by the command: pools do that.
        assert not killed, killed
        assert " attached" not in answer["stdout"]
        assert all(alive(pid) for pid in mains)
        assert after["stdout"] == "still serving\n"


def _carrying(token: str) -> int:
    """Processes whose argv carries ``token`` (every copy of a bash that forks itself), and
    their children that exited and wait to be reaped (a zombie has no argv left): the process
    limit counts both."""
    table = processes()
    bomb = {pid for pid, process in table.items() if any(token in a for a in process.argv)}
    dead = [process for process in table.values() if not process.argv and process.ppid in bomb]
    return len(bomb) + len(dead)


#: A command that forks 20 times, as any build or script does.
NEIGHBOUR = "i=0; while [ $i -lt 20 ]; do /bin/true || exit 9; i=$((i+1)); done; echo fine"
NEIGHBOURS = 10


async def test_a_fork_bomb_is_contained_and_leaves_nothing(bash: Bash, report: Report) -> None:
    bomb_ms = 4_000
    with report.case(
        "Isolation",
        f"A fork bomb (`:(){{ :|:& }};:` in bash, {bomb_ms // 1000} s limit)",
        f"held at its call's process limit ({MAX_PROCESSES}); answered at its time limit; "
        "nothing of it left; the worker serves on",
    ) as row:
        started = time.monotonic()
        # bash retries a fork that fails, so the bomb holds the limit until it is killed. Every
        # copy of it carries the token in its argv.
        token = f"bomb-{secrets.token_hex(8)}"
        line = f"exec bash -c ':(){{ :|:& }};: {token}; sleep 60'"
        bomb = asyncio.ensure_future(bash.raw(line, bomb_ms))
        peak = 0

        def near_the_limit() -> bool:
            nonlocal peak
            peak = max(peak, _carrying(token))
            return peak >= MAX_PROCESSES * 0.8

        reached = await asyncio.to_thread(_within, near_the_limit, bomb_ms / 1000)
        # Calls of other runs while the bomb holds its limit: the limit is the bomb's call's own.
        during = _carrying(token)
        neighbours = await asyncio.gather(
            *(bash.raw(NEIGHBOUR, run_id=f"{bash.caller.run_id}-n{n}") for n in range(NEIGHBOURS))
        )
        result = await asyncio.wait_for(bomb, 30)
        elapsed = time.monotonic() - started
        await asyncio.to_thread(
            wait_for,
            lambda: _carrying(token) == 0,
            10,
            "the bomb's processes to end",
        )
        after = await bash("echo still serving")
        answer = json.loads(result.output)
        bomb_layers = [layer for layer in answer["isolation"] if layer.startswith("cgroup")]
        row.counts = bash.counts
        row.observed = (
            f"peaked at {peak} processes (pids_peak {answer['usage']['pids_peak']}); answered in "
            f"{elapsed:.1f} s (timed out: {answer['timed_out']}, killed_processes "
            f"{answer['usage']['killed_processes']}); none left; the next call was served"
        )
        assert reached, f"the bomb peaked at {peak} processes"
        assert peak <= MAX_PROCESSES
        assert answer["timed_out"]
        assert after["stdout"] == "still serving\n"
    fine = [n for n in neighbours if not n.is_error and json.loads(n.output)["exit_code"] == 0]
    with report.case(
        "Isolation",
        f"{NEIGHBOURS} calls of other runs on the same sandbox worker while a fork bomb holds its "
        "own call's process limit",
        "all run normally",
    ) as row:
        row.counts = Counts(
            sent=NEIGHBOURS,
            answered=sum(n.error_kind != "no_answer" for n in neighbours),
            lost=sum(n.error_kind == "no_answer" for n in neighbours),
        )
        if len(fine) == NEIGHBOURS:
            row.observed = (
                f"{len(fine)}/{NEIGHBOURS} ran normally, started with {during} processes of the "
                "bomb running"
            )
        else:
            failed = next(n for n in neighbours if n not in fine)
            shown = failed.output if failed.is_error else json.loads(failed.output)["stderr"]
            row.passed = False
            row.observed = f"{len(fine)}/{NEIGHBOURS} ran normally; one said {shown[:120]!r}"
            row.open_gap = (
                f"the process limit (TOOLQ_SANDBOX_MAX_PROCESSES={MAX_PROCESSES}) is RLIMIT_NPROC "
                f"of the one sandbox user ({SANDBOX_USER}) where the worker can make no pids "
                "control group: a fork bomb in one call leaves the concurrent calls of the same "
                "worker host unable to fork until it is killed."
            )
            # With a pids control group per call the limit is the bomb's own: no gap excuses it.
            assert not any(layer.endswith("(pids)") for layer in bomb_layers), row.observed


def _within(condition: Any, seconds: float) -> bool:
    try:
        wait_for(condition, seconds, "condition")
    except AssertionError:
        return False
    return True


def _memory_group(answer: dict[str, Any]) -> bool:
    return any("memory" in layer for layer in answer["isolation"] if layer.startswith("cgroup"))


#: What it means when no memory control group holds a command.
NO_MEMORY_GROUP = (
    "this worker can make no memory control group, so TOOLQ_SANDBOX_MEMORY_MB is an "
    "address-space rlimit per process: runtimes that reserve more than they use (the JVM, Go, "
    "Node) fail at start, and a command's processes together may hold more than the limit."
)


async def test_memory_is_limited_by_what_a_command_holds(bash: Bash, report: Report) -> None:
    reserve = await bash(
        "python3 -c 'import mmap; m = mmap.mmap(-1, 8 << 30); print(len(m) >> 30, \"GiB\")'"
    )
    with report.case(
        "Isolation",
        "A JVM-like reservation: `python3` maps 8 GiB and touches none of it",
        f"runs: the memory limit ({MEMORY_MB} MiB) counts what a command holds, not what it "
        "reserves",
    ) as row:
        row.counts = Counts(sent=1, answered=1)
        said = (reserve["stdout"] or reserve["stderr"]).strip().splitlines()[-1:] or [""]
        row.observed = (
            f"exit {reserve['exit_code']}: {said[0][:60]}; peak "
            f"{(reserve['usage']['max_rss_kb'] or 0) // 1024} MiB"
        )
        if not _memory_group(reserve):
            row.open_gap = NO_MEMORY_GROUP
        assert reserve["exit_code"] == 0
        assert reserve["stdout"] == "8 GiB\n"
    hog = await bash("python3 -c 'b = bytearray(2 << 30); print(\"allocated\")'", 20_000)
    after = await bash("echo still serving")
    with report.case(
        "Isolation",
        "A memory hog: `python3` touching 2 GiB",
        f"stopped by the memory limit ({MEMORY_MB} MiB of resident memory and swap), answered "
        "`oom_killed: true`; the worker serves on",
    ) as row:
        row.counts = Counts(sent=2, answered=2)
        usage = hog["usage"]
        row.observed = (
            f"exit {hog['exit_code']}, oom_killed: {usage['oom_killed']}, peak "
            f"{(usage['max_rss_kb'] or 0) // 1024} MiB: "
            f"{hog['stderr'].strip().splitlines()[-1][:70]}"
        )
        if not _memory_group(hog):
            row.open_gap = NO_MEMORY_GROUP
        assert usage["oom_killed"] is True
        assert "allocated" not in hog["stdout"]
        assert (usage["max_rss_kb"] or 0) <= MEMORY_MB * 1024
        assert after["stdout"] == "still serving\n"


async def test_a_file_cannot_grow_past_the_limit(bash: Bash, report: Report) -> None:
    with report.case(
        "Isolation",
        f"Writing a 64 MiB file with a {FILE_SIZE_MB} MiB file-size limit",
        f"the write is stopped at {FILE_SIZE_MB} MiB and reported",
    ) as row:
        answer = await bash("head -c 64M /dev/zero > big.bin")
        size = (bash.workspace / "big.bin").stat().st_size
        row.counts = bash.counts
        row.observed = f"file stopped at {size / 2**20:.0f} MiB; {answer['stderr'].strip()[:80]}"
        assert size <= FILE_SIZE_MB * 2**20
        assert "file size limit" in answer["stderr"].lower()
    (bash.workspace / "big.bin").unlink()
    files = 4
    with report.case(
        "Isolation",
        f"Writing {files} files of {FILE_SIZE_MB - 1} MiB each against a {QUOTA_MB} MiB "
        "workspace quota",
        "the answer says the workspace is past its quota; the next write_file and run_bash are "
        "refused until files are removed",
    ) as row:
        answer = await bash(
            f"for i in $(seq {files}); do head -c {FILE_SIZE_MB - 1}M /dev/zero > f$i.bin; done"
        )
        written = sum(p.stat().st_size for p in bash.workspace.glob("f*.bin"))
        write = await bash.caller("write_file", {"path": "more.txt", "content": "more"})
        again = await bash.raw("echo more > more.txt")
        removed = [await bash.caller("remove", {"path": f"f{i}.bin"}) for i in range(1, files)]
        freed = await bash.caller("write_file", {"path": "more.txt", "content": "more"})
        row.counts = Counts(sent=4 + len(removed), answered=4 + len(removed))
        row.observed = (
            f"{written / 2**20:.0f} MiB written; the answer: "
            f"{answer.get('notice', 'no notice')[:70]}…; next write_file: {write.error_kind}, "
            f"run_bash: {again.error_kind}; after removing 3 files write_file: "
            f"{freed.error_kind or 'ok'}"
        )
        if "notice" not in answer:
            row.open_gap = (
                "the workspace quota (TOOLQ_WORKSPACE_QUOTA_BYTES) is not accounted: a run can "
                "fill the disk that holds every run's workspace."
            )
        assert "past its quota" in answer.get("notice", "")
        assert write.error_kind == "over_quota"
        assert again.error_kind == "over_quota"
        assert not any(r.is_error for r in removed)
        assert not freed.is_error, freed.output
    for path in bash.workspace.glob("f*.bin"):
        path.unlink()


async def test_nothing_a_command_starts_outlives_its_call(bash: Bash, report: Report) -> None:
    tags = ["301.1", "301.2", "301.3", "301.4"]
    with report.case(
        "Isolation",
        "Processes left behind: `cmd &`, a `setsid` daemon, `nohup`, a double-forked child",
        "the call answers without waiting for them (not at its time limit); all 4 counted in "
        "`killed_processes`; none of them is running after it",
    ) as row:
        started = time.monotonic()
        answer = await bash(
            f"sleep {tags[0]} & setsid sleep {tags[1]} & "
            f"nohup sleep {tags[2]} >/dev/null 2>&1 & (sleep {tags[3]} &); echo started"
        )
        elapsed = time.monotonic() - started
        left = [tag for tag in tags if find_process(("sleep", tag))]
        killed = answer["usage"]["killed_processes"]
        row.counts = bash.counts
        row.observed = (
            f"answered in {elapsed:.1f} s; killed_processes: {killed}; {len(left)} of "
            f"{len(tags)} still running"
        )
        assert not left
        # Waiting for their pipes to close would have run into the call's time limit.
        assert not answer["timed_out"]
        assert killed == len(tags)


async def test_a_command_has_no_network(bash: Bash, report: Report) -> None:
    # Only addresses on this machine are ever tried: checked first, so a machine without the
    # namespace skips before any connection is attempted.
    first = await bash("true")
    if "network-namespace" not in first["isolation"]:
        pytest.skip("this machine gives run_bash no network namespace")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        targets = [("127.0.0.1", bash.stack.redis.port), listener.getsockname()]
        probe = (
            "import socket\n"
            f"for host, port in {targets!r}:\n"
            "    try:\n"
            "        socket.create_connection((host, port), timeout=2).close()\n"
            "        print(host, port, 'reached')\n"
            "    except OSError as exc:\n"
            "        print(host, port, 'unreachable:', exc.strerror or exc)\n"
        )
        answer = await bash(f"python3 - <<'EOF'\n{probe}EOF")
    with report.case(
        "Isolation",
        "run_bash connects to the fleet's Redis and to another listener on this machine",
        "unreachable: the sandbox has an empty network namespace",
    ) as row:
        reached = [line for line in answer["stdout"].splitlines() if line.endswith("reached")]
        row.counts = bash.counts
        row.observed = "; ".join(answer["stdout"].strip().splitlines())
        assert answer["stdout"].count("unreachable:") == len(targets)
        assert not reached
