"""A task's network comes from its sandbox configuration: toolq.yaml's ``network``, or
``ToolqSandboxConfig(network=...)``; one that is not a network stops the task in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.inspect_sandbox.image_config import ToolqSandboxConfig, sandbox_config


def test_the_network_is_read_from_the_tasks_configuration(tmp_path: Path) -> None:
    config = tmp_path / "toolq.yaml"
    config.write_text("network:\n  - pypi.org:443\n  - files.pythonhosted.org:443\n")
    assert sandbox_config(str(config)).network == ["pypi.org:443", "files.pythonhosted.org:443"]
    assert sandbox_config(ToolqSandboxConfig(network="full")).network == "full"
    assert sandbox_config(None).network == "none"


def test_a_bad_network_stops_the_task_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "toolq.yaml"
    config.write_text("network: [pypi.org]\n")
    with pytest.raises(ValueError, match="has no port") as refused:
        sandbox_config(str(config))
    assert "\n" not in str(refused.value)
