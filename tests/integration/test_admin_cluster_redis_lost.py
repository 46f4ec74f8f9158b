"""A one-off write pending on a stopped node survives Redis losing its data.

The stream alone would lose it: the node that issued it keeps it in its spool until the nodes
named have applied it, and gives it back to a Redis that lost its data, for them alone; the node
applies it when it comes back, once. One too old to be applied late is named in a WARNING."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.admin_cluster import admin_cluster, admin_command, inject
from tests.support.services import RedisServer
from tests.support.sinks import ScriptedSink, wait_until

GIVEN_BACK = "not yet applied on the nodes named given back"


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


@pytest.mark.parametrize("issuer", ["running", "stopped meanwhile"])
def test_a_bounce_pending_on_a_stopped_node_is_applied_there_once_after_redis_lost_its_data(
    tmp_path: Path, sink: ScriptedSink, redis_server: RedisServer, issuer: str
) -> None:
    # An outside tester: c held 45 a3.test messages; c stopped; `pigeon bounce --domain a3.test`
    # through a said "c (pending) ... it applies it when it starts" (exit 75); Redis restarted
    # without its data; c started, and still held the 45 messages: never bounced, no log line.
    with admin_cluster(tmp_path, sink.endpoint, redis_server.url, (("a", 2), ("b", 1), ("c", 1))) as (a, b, c):
        shown = admin_command(a, "suspend", "--domain", "a3.test")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        inject(c, "user@a3.test", 45)
        c.stop()
        shown = admin_command(a, "bounce", "--domain", "a3.test", "--reason", "x")
        assert shown.returncode == 75, shown.stdout + shown.stderr
        assert "c (pending)" in shown.stdout, shown.stdout
        if issuer == "stopped meanwhile":
            a.stop()
        redis_server.restart()  # no persistence: the stream is gone
        if issuer == "stopped meanwhile":
            b.wait_stderr("Redis held none of the cluster's standing rules", timeout=10)  # b found the loss first
            a.start()  # a gives it back as it starts
        c.start()
        wait_until(lambda: len(c.records("AdminBounce")) >= 45, 15)
        # Lost again at once: a may give it back again before it learns c applied it; c does not apply it twice.
        redis_server.restart()
        time.sleep(4.0)  # (every worker has looked again, and read what was given back)
        records = c.records("AdminBounce")
        assert len(records) == 45 and len({r["id"] for r in records}) == 45, records
        assert "admin bounce by ops of domain=a3.test: 45 messages" in c.stderr(), c.stderr()
        assert "(POST /api/v1/admin/bounce for c)" in a.stderr(), a.stderr()  # given back by a, a supervisor's node
        assert c.stderr().count("admin bounce by ops") == 1, c.stderr()
        assert not b.records("AdminBounce") and not a.records("AdminBounce")
        assert sink.received == []


def test_an_operation_too_old_to_give_back_is_named_in_a_warning_on_the_node_that_kept_it(
    tmp_path: Path, sink: ScriptedSink, redis_server: RedisServer
) -> None:
    with admin_cluster(
        tmp_path, sink.endpoint, redis_server.url, (("a", 1), ("c", 1)), redis={"late_operations": "1s"}
    ) as (a, c):
        c.stop()
        shown = admin_command(a, "bounce", "--domain", "a3.test", "--reason", "x")
        assert shown.returncode == 75, shown.stdout + shown.stderr
        time.sleep(1.5)
        redis_server.restart()
        said = a.wait_stderr("past [redis] late_operations (1s): not given back", timeout=10)
        assert "was not applied yet on node(s) c" in said and "POST /api/v1/admin/bounce" in said, said
        assert GIVEN_BACK not in a.stderr()
