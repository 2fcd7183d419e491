"""The items table: the query read from a page's address, filters, sort, pages and links."""

from __future__ import annotations

import pytest

from api.batch.summary import ItemSummary
from api.http.viewer.table import ItemQuery, plain_page, select

ITEMS = [
    ItemSummary("a", "ok", "answered", True, 2.0, 100, 2, 0, "The answer is 42"),
    ItemSummary("b", "error", None, None, 0.5, None, 0, 0, None, "model API failed: 500"),
    ItemSummary("c", "ok", "max_turns", False, 9.0, 900, 5, 2, "Stopped"),
    ItemSummary("d", "ok", "answered", None, None, 300, 1, 1, "<b>bold</b>"),
]


def ids(query: ItemQuery) -> list[str]:
    return [item.id for _, item in select(ITEMS, query).rows]


def test_a_page_address_is_read_into_a_query() -> None:
    query, problems = ItemQuery.parse(
        {
            "status": "ok",
            "min_duration": "1.5",
            "max_tokens": "500",
            "q": " ANSWER ",
            "sort": "tokens",
            "order": "desc",
            "page": "2",
            "per_page": "25",
        }
    )
    assert problems == []
    assert query == ItemQuery(
        status="ok",
        min_duration=1.5,
        max_tokens=500,
        q="ANSWER",
        sort="tokens",
        order="desc",
        page=2,
        per_page=25,
    )
    assert query.filtered and not query.plain
    assert ItemQuery.parse({})[0].plain


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"status": "weird"}, "status 'weird' is not one of ok, error, unreadable"),
        ({"min_tokens": "1.5"}, "fewest tokens '1.5' is not a whole number"),
        ({"max_duration": "soon"}, "longest duration 'soon' is not a number"),
        ({"min_duration": "-1"}, "shortest duration '-1' must be zero or more"),
        ({"sort": "colour"}, "sort 'colour' is not one of"),
        ({"per_page": "7"}, "rows per page '7' is not one of 25, 50, 100, 200"),
    ],
)
def test_what_cannot_be_read_is_said_and_left_out(params: dict[str, str], problem: str) -> None:
    query, problems = ItemQuery.parse(params)
    assert len(problems) == 1 and problems[0].startswith(problem)
    assert query == ItemQuery()


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (ItemQuery(status="error"), ["b"]),
        (ItemQuery(stop_reason="none"), ["b"]),
        (ItemQuery(score="passed"), ["a"]),
        (ItemQuery(score="failed"), ["c"]),
        (ItemQuery(score="unscored"), ["b", "d"]),
        (ItemQuery(tool_errors="some"), ["c", "d"]),
        (ItemQuery(tool_errors="none"), ["a", "b"]),
        (ItemQuery(min_duration=1, max_duration=5), ["a"]),
        (ItemQuery(min_tokens=200), ["c", "d"]),
        (ItemQuery(q="answer"), ["a"]),
        (ItemQuery(q="500"), ["b"]),
        (ItemQuery(q="<b>"), ["d"]),
    ],
)
def test_filters(query: ItemQuery, expected: list[str]) -> None:
    assert ids(query) == expected


def test_sorting_puts_missing_values_last_either_way() -> None:
    assert ids(ItemQuery(sort="tokens")) == ["a", "d", "c", "b"]
    assert ids(ItemQuery(sort="tokens", order="desc")) == ["c", "d", "a", "b"]
    assert ids(ItemQuery(sort="duration", order="desc")) == ["c", "a", "b", "d"]
    assert ids(ItemQuery(sort="stop_reason", order="desc")) == ["c", "a", "d", "b"]  # ties: a, d
    assert ids(ItemQuery(sort="finished", order="desc")) == ["d", "c", "b", "a"]


def test_items_keep_their_number_through_filters_and_pages() -> None:
    page = select(ITEMS, ItemQuery(status="ok", per_page=25))
    assert [number for number, _ in page.rows] == [1, 3, 4]
    many = [ItemSummary(f"i{n}", "ok") for n in range(60)]
    second = select(many, ItemQuery(page=2, per_page=25))
    assert (second.first, second.last, second.pages, second.matching) == (26, 50, 3, 60)
    assert second.rows[0] == (26, many[25])
    beyond = select(many, ItemQuery(page=9, per_page=25))
    assert beyond.rows == [] and (beyond.first, beyond.last) == (0, 0)


def test_a_plain_page_is_numbered_from_its_first_item() -> None:
    page = plain_page(ITEMS[:2], 60, ItemQuery(page=3, per_page=25))
    assert [number for number, _ in page.rows] == [51, 52]
    assert page.pages == 3


def test_links_keep_the_query_and_a_second_click_reverses_the_sort() -> None:
    query = ItemQuery(status="ok", q="a b", sort="tokens", page=3)
    assert query.link(page=4) == "?status=ok&q=a+b&sort=tokens&page=4"
    assert query.sort_link("tokens") == "?status=ok&q=a+b&sort=tokens&order=desc"
    assert query.sort_link("id") == "?status=ok&q=a+b&sort=id"
    assert ItemQuery().link() == ""
    assert query.aria_sort("tokens") == "ascending" and query.aria_sort("id") == "none"
