"""`pigeon queue list` / GET /api/v1/messages: Postfix's `mailq`, on a live node with a sink."""

from __future__ import annotations

import json
import smtplib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

ADMIN = "admin-token-0123456789"
READER = "reader-token-0123456789"
ACME = "acme-reader-token-0123456789"
TOKENS = [
    {"name": "ops", "token": ADMIN, "scopes": ["admin", "read"]},
    {"name": "dashboard", "token": READER, "scopes": ["read"]},
    {"name": "acme", "token": ACME, "scopes": ["read"], "tenants": ["acme"]},
]


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


def _node(root: Path, sink: ScriptedSink, workers: int = 1) -> PigeonProcess:
    # Deferred mail waits an hour: it stays deferred while the test looks at it.
    config = delivery_config(sink.endpoint, retry_interval="1h")
    return PigeonProcess(root, node={"workers": workers}, http={"token": TOKENS}, **config)


def _send(pigeon: PigeonProcess, recipient: str, count: int = 1, headers: str = "") -> list[str]:
    ids = []
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        for n in range(count):
            message = f"{headers}Subject: {n}\r\n\r\nhello\r\n".encode()
            client.mail("sender@example.org")
            client.rcpt(recipient)
            code, text = client.data(message)
            assert code == 250
            ids += text.decode().split("queued as ")[1].split()
    return ids


def _list(pigeon: PigeonProcess, query: str = "", token: str = READER) -> tuple[int, Any]:
    return pigeon.http_call("GET", f"/api/v1/messages{query}", None, token)


def _cli(pigeon: PigeonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return zygote.run(
        ["queue", "list", *args, "-c", str(pigeon.config_path), "--token", READER],
        text=True,
        timeout=60,
        cwd=pigeon.root,
        check=False,
    )


def test_queue_list_shows_exactly_the_deferred_mail_with_its_last_reply(tmp_path: Path, sink: ScriptedSink) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        deferred = _send(pigeon, "tempfail@example.net", count=3)
        delivered = _send(pigeon, "ok@other.test", count=2)
        wait_until(lambda: len({r["id"] for r in pigeon.records("TransientFailure")}) == 3)
        wait_until(lambda: len(pigeon.records("Delivery")) == 2)
        status, page = _list(pigeon)
        assert status == 200, page
        assert [m["id"] for m in page["messages"]] == deferred  # oldest first; the delivered ones are gone
        assert page["next"] is None
        for message in page["messages"]:
            assert message["state"] == "deferred"
            assert message["last_response"].startswith("451 4.3.0 try again later"), message
            assert message["recipients"] == ["tempfail@example.net"] and message["recipient_count"] == 1
            assert message["sender"] == "sender@example.org" and message["queue"] == "example.net"
            assert message["attempts"] == 1 and message["next_due"] > time.time() + 3000
            assert message["size"] > 0 and message["created"] <= time.time()
        # As `pigeon inspect` shows it.
        inspected = pigeon.http_call("GET", f"/api/v1/messages/{deferred[0]}", None, READER)[1]
        assert inspected["last_response"] == page["messages"][0]["last_response"]
        shown = _cli(pigeon)
        assert shown.returncode == 0, shown.stderr
        for spool_id in deferred:
            assert f"{spool_id}  deferred" in shown.stdout
        assert not any(spool_id in shown.stdout for spool_id in delivered)
        assert shown.stdout.count("(451 4.3.0 try again later") == 3
        assert "queue example.net, 1 attempt, next in " in shown.stdout
        assert shown.stdout.rstrip().splitlines()[-1].startswith("-- 3 messages, ")
        as_json = json.loads(_cli(pigeon, "--json").stdout)
        assert [m["id"] for m in as_json["messages"]] == deferred and as_json["next"] is None


def test_queue_list_filters_and_pages_in_arrival_order(tmp_path: Path, sink: ScriptedSink) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        first = _send(pigeon, "tempfail@a.test", count=3)
        other = _send(pigeon, "tempfail@b.test", count=2, headers="X-Tenant: acme\r\n")
        more = _send(pigeon, "tempfail@a.test", count=2)
        wait_until(lambda: len({r["id"] for r in pigeon.records("TransientFailure")}) == 7)
        status, page = _list(pigeon, "?domain=a.test")
        assert status == 200, page
        assert [m["id"] for m in page["messages"]] == first + more
        # Pages of 2, each after the last one's `next`: every message once, in order.
        seen: list[str] = []
        after = ""
        while True:
            status, page = _list(pigeon, f"?limit=2{after}")
            assert status == 200 and len(page["messages"]) <= 2, page
            seen += [m["id"] for m in page["messages"]]
            if page["next"] is None:
                break
            after = f"&after={page['next']}"
        assert seen == first + other + more
        # A suspension's mail says so, and --state selects it.
        rule = pigeon.http_call("POST", "/api/v1/admin/suspend", {"domain": "b.test"}, ADMIN)[1]["rule"]["id"]
        status, page = _list(pigeon, "?state=suspended")
        assert [(m["id"], m["state"], m["suspended_by"]) for m in page["messages"]] == [
            (spool_id, "suspended", rule) for spool_id in other
        ]
        assert [m["id"] for m in _list(pigeon, "?state=deferred,due")[1]["messages"]] == first + more
        # A token bound to a tenant lists its tenant's mail alone.
        assert [m["id"] for m in _list(pigeon, token=ACME)[1]["messages"]] == other
        shown = _cli(pigeon, "--limit", "2", "--tenant", "acme")
        assert shown.returncode == 0, shown.stderr
        assert f"more after it: pigeon queue list --after {other[1]}" not in shown.stdout  # its last: no more
        assert f"suspended ({rule}) until resumed" in shown.stdout
        shown = _cli(pigeon, "--limit", "1", "--domain", "a.test")
        assert f"more after it: pigeon queue list --after {first[0]}" in shown.stdout
        # Refusals name the parameter, as the writes' name the member.
        assert _list(pigeon, "?state=stuck")[0] == 400 and _list(pigeon, "?state=stuck")[1]["field"] == "state"
        assert _list(pigeon, "?domain=a%40b")[1]["field"] == "domain"
        assert _list(pigeon, "?limit=0")[1]["field"] == "limit"
        assert _list(pigeon, "?after=xyz")[1]["field"] == "after"
        assert _list(pigeon, "?cluster=1")[0] == 400


def test_queue_list_shows_mail_a_suspension_holds_as_due_at_its_end_not_in_a_minute(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        ops = {"reason": "maintenance"}
        held = pigeon.http_call("POST", "/api/v1/admin/suspend", {"domain": "s.example", **ops}, ADMIN)[1]["rule"]
        ends = {"domain": "t.example", "duration": "2h", **ops}
        timed = pigeon.http_call("POST", "/api/v1/admin/suspend", ends, ADMIN)[1]["rule"]
        # Sent after: each is held as it comes due, untried, looked at again a minute on.
        (until_resumed,) = _send(pigeon, "ok@s.example")
        (until_its_end,) = _send(pigeon, "ok@t.example")
        wait_until(lambda: len(_list(pigeon, "?state=suspended")[1]["messages"]) == 2)
        status, page = _list(pigeon)
        assert status == 200, page
        assert [(m["id"], m["state"], m["suspended_by"], m["next_due"]) for m in page["messages"]] == [
            (until_resumed, "suspended", held["id"], None),
            (until_its_end, "suspended", timed["id"], timed["expires"]),
        ]
        shown = _cli(pigeon)
        assert shown.returncode == 0, shown.stderr
        assert f"queue s.example, 0 attempts, suspended ({held['id']}) until resumed\n" in shown.stdout
        assert f"queue t.example, 0 attempts, suspended ({timed['id']}), next in 2.0h\n" in shown.stdout
        assert shown.stdout.count("next in") == 1  # not when the suspension looks at it again, a minute on
        assert sink.received == []


def test_inspect_says_the_state_queue_list_says_of_deferred_held_and_suspended_mail(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    """Found from outside: `pigeon inspect` said "scheduled" of every message not in memory,
    deferred or held by an operator alike, where `pigeon queue list` said `deferred` and `held`."""
    with _node(tmp_path / "node", sink) as pigeon:
        deferred, held = _send(pigeon, "tempfail@a.test", count=2)
        (suspended,) = _send(pigeon, "tempfail@b.test")
        wait_until(lambda: len({r["id"] for r in pigeon.records("TransientFailure")}) == 3)
        hold = {"messages": [held], "reason": "look first"}
        assert pigeon.http_call("POST", "/api/v1/admin/hold", hold, ADMIN)[0] == 200
        ends = {"domain": "b.test", "duration": "2h"}
        rule = pigeon.http_call("POST", "/api/v1/admin/suspend", ends, ADMIN)[1]["rule"]
        listed = {m["id"]: m for m in _list(pigeon)[1]["messages"]}
        assert {spool_id: m["state"] for spool_id, m in listed.items()} == {
            deferred: "deferred",
            held: "held",
            suspended: "suspended",
        }
        for spool_id, entry in listed.items():
            status, inspected = pigeon.http_call("GET", f"/api/v1/messages/{spool_id}", None, READER)
            assert status == 200 and inspected["in_memory"] is False, inspected
            shown = {key: inspected[key] for key in ("state", "suspended_by", "next_due", "held")}
            assert shown == {key: entry[key] for key in shown}, (spool_id, inspected)
        assert listed[suspended]["next_due"] == rule["expires"]  # its end, not the minute after which it looks again
        assert "state          held" in pigeon.cli("inspect", held).splitlines()
        assert "state          deferred" in pigeon.cli("inspect", deferred).splitlines()


def test_a_query_number_is_ascii_digits_and_a_long_id_is_cut_in_its_refusal(tmp_path: Path, sink: ScriptedSink) -> None:
    """Found from outside: `limit=١٠` (Arabic-Indic digits) was taken as 10, and a 5000-character
    id was echoed whole in its 400, where other refusals cut what they quote."""
    with _node(tmp_path / "node", sink) as pigeon:
        for limit in ("%D9%A1%D9%A0", "%EF%BC%91", "1" * 5000, "%2B5", "%205"):
            status, answer = _list(pigeon, f"?limit={limit}")
            assert (status, answer["field"]) == (400, "limit"), (limit, answer)
            assert len(answer["error"]) < 100, answer
        assert _list(pigeon, "?limit=10")[0] == 200
        long_id = "x" * 5000
        for path in (f"/api/v1/messages/{long_id}", f"/api/v1/messages?after={long_id}"):
            status, answer = pigeon.http_call("GET", path, None, READER)
            assert status == 400 and f"'{'x' * 40}'... must be 16 hex digits" in answer["error"], answer
            assert len(answer["error"]) < 120, answer
        hold = {"messages": [long_id], "reason": "x"}
        status, answer = pigeon.http_call("POST", "/api/v1/admin/hold", hold, ADMIN)
        assert (status, answer["field"]) == (400, "$.messages[0]") and len(answer["error"]) < 120, answer
        shown = _cli(pigeon, "--limit", "\u0661\u0660")
        assert shown.returncode == 2 and "is not a whole number" in shown.stderr, shown.stderr


def test_queue_list_merges_both_workers_messages_in_order(tmp_path: Path, sink: ScriptedSink) -> None:
    with _node(tmp_path / "node", sink, workers=2) as pigeon:
        ids: list[str] = []
        while len(ids) < 10 or (len(ids) < 40 and {int(i, 16) & 63 for i in ids} != {0, 1}):
            ids += _send(pigeon, "tempfail@example.net")
        assert {int(i, 16) & 63 for i in ids} == {0, 1}  # both workers' shards hold some
        wait_until(lambda: len({r["id"] for r in pigeon.records("TransientFailure")}) == len(ids))
        status, page = _list(pigeon, "?limit=1000")
        assert status == 200, page
        assert [m["id"] for m in page["messages"]] == sorted(ids, key=lambda i: int(i, 16)) == ids
        seen: list[str] = []
        after = ""
        while True:
            status, page = _list(pigeon, f"?limit=3{after}")
            assert status == 200, page
            seen += [m["id"] for m in page["messages"]]
            if page["next"] is None:
                break
            after = f"&after={page['next']}"
        assert seen == ids  # across pages too: each once, oldest first
        shown = _cli(pigeon)
        assert [line.split()[0] for line in shown.stdout.splitlines() if line[:1] not in (" ", "-")] == ids
