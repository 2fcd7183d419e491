"""A result line in brief: what the viewer's table keeps of each line."""

from __future__ import annotations

from api.batch.summary import ItemSummary
from tests.api.batch.conftest import record


def test_a_record_is_summarised_by_its_outcome_cost_and_answer() -> None:
    summary = ItemSummary.of(
        record(
            "q1",
            stop_reason="answered",
            duration_s=1.5,
            usage={"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
            tool_calls=[{"name": "a", "is_error": False}, {"name": "b", "is_error": True}],
            score={"passed": False, "method": "exact", "explanation": "no"},
        )
    )
    assert summary == ItemSummary(
        id="q1",
        status="ok",
        stop_reason="answered",
        passed=False,
        duration_s=1.5,
        tokens=14,
        tool_calls=2,
        tool_errors=1,
        answer="ü",
    )
    assert ItemSummary.from_json(summary.to_json()) == summary


def test_fields_missing_or_of_another_shape_are_left_out() -> None:
    odd = {"id": 7, "status": None, "usage": "lots", "tool_calls": "none", "duration_s": True}
    summary = ItemSummary.of({**odd, "score": {"passed": "yes"}, "answer": ["a"]})
    assert summary == ItemSummary(id="7", status="error")


def test_search_looks_in_the_id_answer_and_error_whatever_their_case() -> None:
    summary = ItemSummary.of(record("Q-Upper", answer="Das Maß", error="Rate LIMIT"))
    assert "q-upper" in summary.searchable
    assert "das mass" in summary.searchable  # case-folded: "Maß" and "MASS" match alike
    assert "rate limit" in summary.searchable
    assert ItemSummary.unreadable("line 3", "not JSON").searchable == "line 3\nnot json"
