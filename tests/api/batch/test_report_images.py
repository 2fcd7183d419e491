"""``toolq report`` names the images a batch ran: each reference with the digests it ran (a tag
that moved mid-batch shows both), its items and how they ended; the slowest items name theirs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from api.batch.report import build_report, report_lines
from tests.api.batch.conftest import write_lines
from tests.api.batch.test_report import result

OLD = "sha256:" + "1" * 64
NEW = "sha256:" + "2" * 64


def with_image(line: dict[str, Any], reference: str, digest: str | None) -> dict[str, Any]:
    return {**line, "image": {"reference": reference, "digest": digest}}


def test_the_report_names_each_image_its_digests_and_items(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "out.jsonl",
        [
            with_image(result("a", seconds=5.0), "swe/astropy:1", OLD),
            with_image(result("b"), "swe/astropy:1", NEW),
            with_image(result("c", "error", error="image 'x': no such tag"), "swe/django:2", None),
            result("d", seconds=9.0),
            {**result("e"), "image": "not an object"},
        ],
    )
    report = build_report(path)
    assert report["images"] == [
        {"reference": "swe/astropy:1", "digests": [OLD, NEW], "items": 2, "status": {"ok": 2}},
        {"reference": "swe/django:2", "digests": [], "items": 1, "status": {"error": 1}},
    ]
    slowest = {s["id"]: s.get("image") for s in report["slowest"]}
    assert slowest["a"] == "swe/astropy:1" and slowest["d"] is None
    lines = report_lines(report)
    assert f"  swe/astropy:1 ({OLD}, {NEW}): 2 items, 2 ok" in lines
    assert "  swe/django:2 (no digest): 1 items, 1 error" in lines
    assert any(line.endswith("a (ok, answered, image swe/astropy:1)") for line in lines)
    assert any(line.endswith("d (ok, answered)") for line in lines)


def test_a_batch_without_images_has_no_images_line(tmp_path: Path) -> None:
    report = build_report(write_lines(tmp_path / "out.jsonl", [result("a")]))
    assert report["images"] == []
    assert not any(line.startswith("Images") for line in report_lines(report))
