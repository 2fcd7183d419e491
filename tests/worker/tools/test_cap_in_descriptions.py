"""The model reads the cap a fleet applies (``TOOLQ_OUTPUT_CAP_BYTES``) in the descriptions of
the tools it cuts, as the fleet publishes them: never a default the fleet changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.contract.limits import cap_in_words
from worker.contract.settings import WorkerSettings
from worker.manifest import fleet_tool_specs

CUT_BY_THE_CAP = {
    "read_file": "Files over {cap} are cut",
    "run_bash": "its first {cap}.",
    "bash_session": "its latest {cap} kept",
}


@pytest.mark.parametrize(
    ("cap", "words"), [(51_200, "50 KB"), (10_240, "10 KB"), (1_000, "1,000 bytes")]
)
def test_the_published_descriptions_name_the_fleets_cap(
    tmp_path: Path, cap: int, words: str
) -> None:
    settings = WorkerSettings(workspace_root=tmp_path, plugins=[], output_cap_bytes=cap)

    specs = {spec.name: spec for spec in fleet_tool_specs(settings)}

    assert cap_in_words(cap) == words
    for name, phrase in CUT_BY_THE_CAP.items():
        description = specs[name].description
        assert phrase.format(cap=words) in description, description
        assert specs[name].schema_for_model()["function"]["description"] == description
    others = [s.name for s in specs.values() if "50 KB" in s.description]
    assert others == ([] if cap != 51_200 else list(CUT_BY_THE_CAP))
