"""Pages of `pigeon queue list` merged on their cursors (`pigeon.queue.listing.merge_pages`)."""

from __future__ import annotations

from typing import Any

from pigeon.message import format_id
from pigeon.queue.listing import merge_pages


def _page(ids: list[int], next_id: int | None) -> dict[str, Any]:
    return {"messages": [{"id": format_id(i)} for i in ids], "next": None if next_id is None else format_id(next_id)}


def _ids(page: dict[str, Any]) -> list[int]:
    return [int(row["id"], 16) for row in page["messages"]]


def test_a_worker_that_read_only_part_of_its_spool_holds_back_what_the_others_found_past_it() -> None:
    # Worker 0 ran out of its budget at id 50 having found nothing; worker 1 found 60 and 70.
    # 60 must wait for the next page: worker 0 may hold a message between 50 and 60.
    merged = merge_pages([_page([], 50), _page([60, 70], None)], limit=10)
    assert (_ids(merged), merged["next"]) == ([], format_id(50))
    merged = merge_pages([_page([55], None), _page([60, 70], None)], limit=10)
    assert (_ids(merged), merged["next"]) == ([55, 60, 70], None)


def test_full_pages_interleave_oldest_first_and_the_cursor_is_the_last_shown() -> None:
    merged = merge_pages([_page([1, 4, 5], 5), _page([2, 3, 6], 6)], limit=3)
    assert (_ids(merged), merged["next"]) == ([1, 2, 3], format_id(3))


def test_every_worker_at_its_end_leaves_no_cursor() -> None:
    merged = merge_pages([_page([1, 3], None), _page([2], None)], limit=3)
    assert (_ids(merged), merged["next"]) == ([1, 2, 3], None)
