"""The times of a bulk operation a token bound to tenants reads (`GET /api/v1/admin/operations`)
are whole seconds. They were the worker's own, to the microsecond: a retry of another tenant's
message by id (read, then answered `not_found`) took 127 µs, one of an id nothing has 14 µs, and
`finished - started` told the two apart from one sample. The operator's are left precise."""

from __future__ import annotations

import copy
from typing import Any

from pigeon.listener.http.admin import confined_answer
from pigeon.listener.http.tenancy import coarse_times

ACME = frozenset({"acme"})
PATH = "/api/v1/admin/operations"


def _operation(started: float, finished: float | None = None, tenant: str = "acme") -> dict[str, Any]:
    op: dict[str, Any] = {
        "operation": "r1",
        "kind": "retry",
        "selector": {"tenant": tenant, "messages": ["0382610d06800000"]},
        "looked_at": 0,
        "acted_on": 0,
        "running": 0 if finished is not None else 1,
        "started": started,
    }
    if finished is not None:
        op["finished"] = finished
    return op


def test_a_bound_token_reads_an_operations_times_in_whole_seconds_whatever_it_looked_at() -> None:
    # Another tenant's id (127 µs) and an id of none (14 µs), started in the same second: alike.
    foreign = _operation(1_796_582_060.688548, 1_796_582_060.688675)
    absent = _operation(1_796_582_060.690753, 1_796_582_060.690767)
    stored = copy.deepcopy([foreign, absent])
    shown = confined_answer("GET", PATH, {"operations": [foreign, absent]}, ACME)["operations"]
    assert [(op["started"], op["finished"]) for op in shown] == [(1_796_582_060, 1_796_582_061)] * 2
    assert [foreign, absent] == stored  # (the worker's own record, which the operator reads: as it was)
    # A long one: its length rounded up; a running one: when it started, to the second.
    long = confined_answer("GET", PATH, {"operations": [_operation(1000.9, 1003.2)]}, ACME)["operations"]
    assert (long[0]["started"], long[0]["finished"]) == (1000, 1003)
    running = confined_answer("GET", PATH, {"operations": [_operation(1000.9)]}, ACME)["operations"]
    assert running[0]["started"] == 1000 and "finished" not in running[0]
    # Whole already (a cluster's nodes' answers, added up, then confined again): as they are.
    assert coarse_times(long[0]) == long[0]


def test_the_operator_reads_an_operations_times_as_precise_as_the_worker_took_them() -> None:
    answer = {"operations": [_operation(1_796_582_060.688548, 1_796_582_060.688675)]}
    shown = confined_answer("GET", PATH, copy.deepcopy(answer), None)
    assert shown == answer
