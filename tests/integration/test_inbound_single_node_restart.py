"""Without [redis], a node stopped (or killed) while its IMAP server is unreachable, after its
target accepted messages and before the server took their acknowledgement, handed them all to
the application again at its next start, and nothing said so; their records said
`acknowledged: "seen"` all the same. Its done marks lived in its memory only. They are kept in
the spool now: the next start acknowledges those messages at the source and records that,
without handing them over again, and the stop says it leaves them for it.

Against a private Dovecot, through a proxy that cuts the node's way to it at the very command
that acknowledges the batch (and refuses connections until the test lets it through again)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.apps import customer_mail, imap_mailbox, redis_in_use_for_a_while
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot, RedisServer
from tests.support.sinks import wait_until
from tests.support.tcp_proxy import TcpProxy

_COUNT = 10
# The command that acknowledges a batch, as the node sends it: \Seen, a move, or the first of a
# deletion's two (\Deleted, then EXPUNGE).
_ACKNOWLEDGEMENT = {
    "seen": rb" UID STORE \S+ \+FLAGS\.SILENT \(\\Seen\)",
    "move": rb" UID MOVE ",
    "delete": rb" UID STORE \S+ \+FLAGS\.SILENT \(\\Deleted ",
}


def _handed_over(path: Path) -> list[str]:
    """The dedupe keys a log target holds, one per handoff."""
    if not path.exists():
        return []
    return [json.loads(line)["dedupe_key"] for line in path.read_bytes().splitlines()]


def _node(
    tmp_path: Path, dovecot: Dovecot, proxy: TcpProxy, after_delivery: str, redis: RedisServer | None = None
) -> PigeonProcess:
    moved = {"move_to": "Processed"} if after_delivery == "move" else {}
    box = imap_mailbox(dovecot, "audit", port=proxy.port, tls="none", poll_interval="1s",
                       after_delivery=after_delivery, **moved)  # fmt: skip
    target = {"name": "audit", "kind": "log", "path": str(tmp_path / "handed.jsonl")}
    shared = {"redis": {"url": redis.url}} if redis is not None else {}
    return PigeonProcess(tmp_path / "node", target=[target], mailbox=[box], **shared)


def _acknowledged(dovecot: Dovecot, after_delivery: str) -> bool:
    if after_delivery == "move":
        return dovecot.count("app") == 0 and dovecot.count("app", "Processed") == _COUNT
    if after_delivery == "delete":
        return dovecot.count("app") == 0
    return not dovecot.unseen("app")


def _handed_over_and_cut_off(tmp_path: Path, node: PigeonProcess, proxy: TcpProxy, dovecot: Dovecot) -> list[str]:
    """Every message handed over, none acknowledged: the proxy cut the acknowledgement off."""
    assert proxy.was_cut.wait(30), node.stderr()
    wait_until(lambda: len(_handed_over(tmp_path / "handed.jsonl")) >= _COUNT, 15)
    node.wait_records("InboundDelivery", _COUNT, timeout=15)
    assert len(dovecot.unseen("app")) == _COUNT  # nothing acknowledged at the server
    return _handed_over(tmp_path / "handed.jsonl")


def _started_again_each_message_is_acknowledged_not_handed_over(
    tmp_path: Path, node: PigeonProcess, proxy: TcpProxy, dovecot: Dovecot, after_delivery: str, first: list[str]
) -> list[dict[str, Any]]:
    proxy.cut_at = None
    proxy.restore()
    node.start()
    wait_until(lambda: _acknowledged(dovecot, after_delivery), 30)
    records = node.wait_records("InboundDelivery", 2 * _COUNT, timeout=10)
    assert node.stop() == 0
    handed = _handed_over(tmp_path / "handed.jsonl")
    assert len(handed) == _COUNT, f"{len(handed) - _COUNT} messages handed to the application again"
    assert sorted(handed) == sorted(first)
    started = node.stderr()
    assert f"{_COUNT} messages handed over by an earlier run of this node, test-node (token h" in started, started
    # The spool keeps the marks of what waits for its acknowledgement: none, once all are.
    assert (node.spool_path / "inbound-marks").read_bytes() == b""
    return records


def _each_recorded_as_handed_over_then_as_recovered(
    records: list[dict[str, Any]], first: list[str], after_delivery: str
) -> None:
    """One record of each handoff, and one of each acknowledgement the next start made for it,
    both naming the acknowledgement asked of the source."""
    handoffs = [r for r in records if not r.get("recovered_from")]
    recovered = [r for r in records if r.get("recovered_from")]
    assert sorted(r["dedupe_key"] for r in handoffs) == sorted(first)
    assert sorted(r["dedupe_key"] for r in recovered) == sorted(first)
    wanted = {"move": "moved to Processed", "delete": "deleted"}.get(after_delivery, "seen")
    assert {r["acknowledged"] for r in records} == {wanted}
    assert all(r["detail"].startswith("recovered: handed over by node test-node") for r in recovered)


@pytest.mark.parametrize("after_delivery", ["seen", "move", "delete"])
def test_a_node_stopped_before_its_server_took_the_acknowledgement_acknowledges_at_its_next_start(
    tmp_path: Path, dovecot: Dovecot, after_delivery: str
) -> None:
    dovecot.append("app", [customer_mail(i) for i in range(_COUNT)])
    with TcpProxy(dovecot.port, cut_at=_ACKNOWLEDGEMENT[after_delivery]) as proxy:
        node = _node(tmp_path, dovecot, proxy, after_delivery)
        try:
            node.start()
            first = _handed_over_and_cut_off(tmp_path, node, proxy, dovecot)
            assert node.stop() == 0
            stopped = node.stderr()
            assert (
                f"WARNING pigeon.inbound.mailbox: mailbox support: {_COUNT} messages handed over and not acknowledged "
                f"at the source (UIDs 1:{_COUNT}): the next start acknowledges them without handing them over again"
            ) in stopped, stopped
            records = _started_again_each_message_is_acknowledged_not_handed_over(
                tmp_path, node, proxy, dovecot, after_delivery, first
            )
        finally:
            node.kill()
    _each_recorded_as_handed_over_then_as_recovered(records, first, after_delivery)


def test_a_node_killed_before_its_server_took_the_acknowledgement_acknowledges_at_its_next_start(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    dovecot.append("app", [customer_mail(i) for i in range(_COUNT)])
    with TcpProxy(dovecot.port, cut_at=_ACKNOWLEDGEMENT["seen"]) as proxy:
        node = _node(tmp_path, dovecot, proxy, "seen")
        try:
            node.start()
            first = _handed_over_and_cut_off(tmp_path, node, proxy, dovecot)
            node.kill()
            records = _started_again_each_message_is_acknowledged_not_handed_over(
                tmp_path, node, proxy, dovecot, "seen", first
            )
        finally:
            node.kill()
    _each_recorded_as_handed_over_then_as_recovered(records, first, "seen")


def test_with_redis_a_stop_before_the_server_took_the_acknowledgement_says_the_next_start_acknowledges(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    redis_in_use_for_a_while(redis_server)
    dovecot.append("app", [customer_mail(i) for i in range(_COUNT)])
    with TcpProxy(dovecot.port, cut_at=_ACKNOWLEDGEMENT["seen"]) as proxy:
        node = _node(tmp_path, dovecot, proxy, "seen", redis_server)
        try:
            node.start()
            first = _handed_over_and_cut_off(tmp_path, node, proxy, dovecot)
            assert node.stop() == 0
            stopped = node.stderr()
            assert (
                f"mailbox support: {_COUNT} messages handed over and not acknowledged at the source (UIDs 1:{_COUNT}): "
                "the next start (or another node) acknowledges them without handing them over again"
            ) in stopped, stopped
            proxy.cut_at = None
            proxy.restore()
            node.start()
            wait_until(lambda: not dovecot.unseen("app"), 30)
            node.wait_records("InboundDelivery", 2 * _COUNT, timeout=10)
        finally:
            node.kill()
    assert sorted(_handed_over(tmp_path / "handed.jsonl")) == sorted(first)
