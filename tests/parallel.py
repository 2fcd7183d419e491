"""The suite run across processes (pytest-xdist, ``make test``): what tests share stays on one
of them, and what belongs to the host is put back once, by the process that started them all.

Tests that share a stack through a module- or class-scoped fixture are sent to one process as a
group (``--dist loadgroup``): split, each process would start the stack again. New tests get
this without asking: the group comes from the fixtures they use. A test may name its own group
(``@pytest.mark.xdist_group("...")``) for a host-wide resource that only one test at a time may
hold.
"""

from __future__ import annotations

import contextlib

import pytest

from tests.host_sysctls import host_sysctls_restored

#: Fixture scopes shared by several tests of one file: their tests run in one process.
SHARED_SCOPES = {"module", "class", "package"}
#: Tests that each start toolq's commands on local stacks of their own (a Redis and two worker
#: pools per command): they are CPU-bound while those start, and on a loaded machine several at
#: once overrun their commands' bounds. They run one at a time, in one process, from the first
#: test on, while the other processes run the rest.
LOCAL_STACKS = ("tests/e2e/", "tests/docs/")
LOCAL_STACKS_GROUP = "local-stacks"


def is_worker(config: pytest.Config) -> bool:
    """This process runs tests for a controller (pytest-xdist's ``-n``)."""
    return hasattr(config, "workerinput")


def shared_group(item: pytest.Item) -> str | None:
    """The group of tests ``item`` shares a fixture with: its file's (or package's) path."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    module = item.nodeid.split("::", 1)[0]
    group = None
    for definitions in info.name2fixturedefs.values():
        scope = definitions[-1].scope
        if scope == "package":
            return module.rsplit("/", 1)[0]
        if scope in SHARED_SCOPES:
            group = module
    return group


def group_shared_fixtures(items: list[pytest.Item]) -> None:
    """Each test that starts local stacks is put in their group, moved first; each other test
    that uses a module-, class- or package-scoped fixture, and names no group of its own, in its
    file's group."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        group = LOCAL_STACKS_GROUP if item.nodeid.startswith(LOCAL_STACKS) else shared_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # sort() is stable: the order is otherwise collection's, the same in every process.
    items.sort(key=lambda item: not item.nodeid.startswith(LOCAL_STACKS))


class HostAsFound:
    """The host's sysctls that a process-mode sandbox worker turns on, put back as found at the
    end of the run, by the controller alone: a process that finished first must not turn them off
    under another's sandbox worker."""

    def __init__(self) -> None:
        self._restored: contextlib.ExitStack | None = None

    def start(self, config: pytest.Config) -> None:
        if is_worker(config):
            return
        self._restored = contextlib.ExitStack()
        self._restored.enter_context(host_sysctls_restored())

    def finish(self) -> None:
        if self._restored is not None:
            self._restored.close()
            self._restored = None
