"""``python -m bench.flame [--conversations N] [--out FILE] [--tree DIR]``: where ``toolq batch``
spends its time, as pyinstrument's text output trimmed to the frames that take at least 1% of it,
then the functions that take the most time themselves.

It starts its own Redis, a tools worker of 2 processes and the scripted model (case 13's
conversations: turns of two parallel no-op calls), warms them with a small batch, then runs
``toolq batch`` of N conversations at once under pyinstrument, in a process of its own. The
profile is of the batch process's main thread, which runs the event loop and every conversation
(time in ``select`` is the loop waiting); the thread that publishes the calls is not sampled, and
the header gives its CPU. The samples are wall-clock: on a busy machine a frame also collects
the time its thread waited for the CPU or the GIL. ``--tree`` runs the batch from another
checkout of toolq, to compare two versions on the same workers.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from api.local.stack import worker_environment
from bench.conversations import CALLS_PER_TURN, TURNS_WITH_TOOLS, scripted_model, write_prompts
from bench.stack import bench_settings, private_redis, python_path, run_checked, toolq_workers

RESULTS = Path(__file__).resolve().parent / "results"
#: Frames under this share of the run are left out of the tree.
THRESHOLD = 0.01
#: Lines of the tree, and functions of the flat list, kept.
TREE_LINES = 90
FLAT_LINES = 30


def profile_inside(out: Path, argv: list[str]) -> int:
    """Run ``toolq argv`` in this process under pyinstrument; write the summary to ``out``."""
    from pyinstrument import Profiler

    from api.cli import main

    sys.argv = ["toolq", *argv]
    profiler = Profiler(interval=0.001, async_mode="disabled")
    cpu_before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    main_before = time.thread_time()
    code = 0
    profiler.start()
    try:
        main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        profiler.stop()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime
    main_cpu = time.thread_time() - main_before
    tree = profiler.output_text(
        unicode=True, processor_options={"filter_threshold": THRESHOLD}
    ).splitlines()
    flat = profiler.output_text(unicode=True, flat=True).splitlines()
    header = [
        f"The batch process: {time.perf_counter() - started:.1f} s, CPU {cpu:.2f} s (main thread "
        f"{main_cpu:.2f} s, other threads, the sending one, {cpu - main_cpu:.2f} s); load "
        f"average {os.getloadavg()[0]:.2f} on {len(os.sched_getaffinity(0))} cores.",
        "",
    ]
    body = [*_trimmed(tree, TREE_LINES), "", "Functions by their own time:", ""]
    out.write_text("\n".join([*header, *body, *_trimmed(flat, FLAT_LINES)]) + "\n")
    return code


def _trimmed(lines: list[str], keep: int) -> list[str]:
    """pyinstrument's lines without its banner (they start at the first time), at most
    ``keep`` of them."""
    start = next((n for n, line in enumerate(lines) if line[:1].isdigit()), len(lines))
    shown = [line.rstrip() for line in lines[start:] if line.strip()]
    return shown[:keep] + ([f"... {len(shown) - keep} more lines"] if len(shown) > keep else [])


def run(conversations: int, out: Path, tree: Path | None) -> None:
    repo = Path(__file__).resolve().parents[1]
    with (
        private_redis() as url,
        tempfile.TemporaryDirectory(prefix="toolq-bench-flame-") as folder,
    ):
        os.chmod(folder, 0o755)
        settings = bench_settings(url, Path(folder) / "ws")
        (Path(folder) / "ws").mkdir(mode=0o755)
        with toolq_workers(settings, 2, ("tools",)), scripted_model() as (llm_url, _):
            env = {
                **os.environ,
                **worker_environment(settings),
                "PYTHONPATH": str(tree) if tree else python_path(),
                "OPENAI_BASE_URL": llm_url,
                "OPENAI_API_KEY": "unused",
            }
            for name, count in (("warm", 10), ("items", conversations)):
                items = write_prompts(Path(folder) / f"{name}.jsonl", count, name)
                batch = ["batch", str(items), "-o", str(items.with_suffix(".out"))]
                batch += ["--concurrency", str(count), "--model", "scripted"]
                # This file, run by path: the batch's toolq is the one on PYTHONPATH.
                inside = (
                    f"import runpy, sys; sys.argv = {[__file__, '--inside', str(out), *batch]!r}"
                )
                inside += f"; runpy.run_path({__file__!r}, run_name='__main__')"
                argv = [sys.executable, "-c", inside] if name == "items" else None
                argv = argv or [sys.executable, "-m", "api.cli", *batch]
                run_checked(argv, env, f"the {name} batch", timeout=900, cwd=folder)
    version = _version(tree or repo)
    title = (
        f"toolq batch of {conversations:,} conversations at once ({TURNS_WITH_TOOLS} turns of "
        f"{CALLS_PER_TURN} parallel no-op calls, scripted model, a tools worker of 2 processes, "
        f"all on this machine), code of {version}; pyinstrument, wall-clock samples of the "
        "batch process's main thread."
    )
    out.write_text(f"{title}\n{out.read_text()}")


def _version(tree: Path) -> str:
    """The checkout's commit, and whether its files differ from it."""
    described = subprocess.run(
        ["git", "-C", str(tree), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    )
    return described.stdout.strip() or str(tree)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--inside"]:  # the profiled batch process: --inside OUT toolq-arguments...
        return profile_inside(Path(argv[1]), argv[2:])
    parser = argparse.ArgumentParser(prog="python -m bench.flame", description=__doc__)
    parser.add_argument("--conversations", type=int, default=300)
    parser.add_argument("--out", type=Path, default=RESULTS / "flame-batch.txt")
    parser.add_argument("--tree", type=Path, help="another checkout of toolq to profile")
    args = parser.parse_args(argv)
    run(args.conversations, args.out.resolve(), args.tree)
    print(f"profile in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
