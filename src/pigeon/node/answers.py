"""Adding up answers: one API answer from several workers' (or nodes') answers to one request."""

from __future__ import annotations

from typing import Any


def merge_answers(answers: list[tuple[int, Any]]) -> tuple[int, Any]:
    """One answer from every worker's: the first refusal (4xx/5xx but 404) as it is; else
    counts added up, lists joined (rules by id once), "cancelled" if any worker cancelled,
    and 404 only if no worker had what was asked for."""
    for status, answer in answers:
        if status >= 400 and status != 404:
            return status, answer
    found = [answer for status, answer in answers if status < 400]
    if not found:
        return answers[0]
    merged: dict[str, Any] = {}
    for answer in found:
        for key, value in answer.items():
            if isinstance(value, bool):
                merged[key] = merged.get(key, False) or value
            elif isinstance(value, int | float) and key not in ("created", "next_due", "size", "attempts"):
                merged[key] = merged.get(key, 0) + value
            elif (
                isinstance(value, list)
                and value
                and isinstance(value[0], dict)
                and ("queue" in value[0] or "path" in value[0] or "operation" in value[0])
            ):
                merged[key] = _merge_rows(merged.get(key, []), value)
            elif isinstance(value, list):
                seen = {item.get("id") for item in merged.get(key, []) if isinstance(item, dict)}
                merged[key] = merged.get(key, []) + [
                    v for v in value if not isinstance(v, dict) or v.get("id") not in seen
                ]
            elif merged.get(key) is None:
                merged[key] = value
    return 200, merged


def _merge_rows(rows: list[dict[str, Any]], more: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Queue rows of several workers, one per queue: counts added, the oldest kept."""
    by_key = {_row_key(row): dict(row) for row in rows}
    for row in more:
        key = _row_key(row)
        mine = by_key.setdefault(key, {})
        for name, value in row.items():
            if name in ("oldest", "started"):
                mine[name] = min(mine.get(name, value), value)
            elif name == "finished":
                mine[name] = max(mine.get(name, value), value)
            elif isinstance(value, int | float) and not isinstance(value, bool):
                mine[name] = mine.get(name, 0) + value
            elif mine.get(name) is None:  # the first known (a worker may not know a queue's provider yet)
                mine[name] = value
    return sorted(by_key.values(), key=lambda r: str(_row_key(r)))


def _row_key(row: dict[str, Any]) -> Any:
    return row.get("queue") or row.get("path") or row.get("operation")
