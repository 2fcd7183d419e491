"""Which runtimes' containers hold shell sessions: runc's do; gVisor's (runsc) are refused in
one line that says what to use instead."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.worker.images.conftest import box_settings
from worker.images.box_shells import gvisor_refusal


def test_runc_containers_take_sessions(tmp_path: Path) -> None:
    if shutil.which("runc") is None:
        pytest.skip("runc is not installed (Debian's runc package)")
    assert gvisor_refusal(box_settings(tmp_path, "runc")) is None


def test_gvisor_containers_refuse_sessions_in_one_line(tmp_path: Path) -> None:
    if shutil.which("runsc") is None:
        pytest.skip("runsc is not installed (gVisor's runsc package)")
    refusal = gvisor_refusal(box_settings(tmp_path, "runsc"))
    assert refusal is not None and "\n" not in refusal
    assert "use run_bash" in refusal and "TOOLQ_OCI_RUNTIME=runc" in refusal
