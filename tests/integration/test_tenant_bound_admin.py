"""A token bound to tenants (`[[http.token]] tenants`) reaches those tenants' mail alone, at every
endpoint, through a node's one worker, a supervisor of several, the `pigeon` commands and a
cluster: it listed globex's queues, inspected its messages and bounced them all (5 AdminBounce
records under `acme-admin`), resumed the operator's suspension and retried every domain's mail.

Its writes name one of its tenants (filled in for a token of one tenant; 403 naming `$.tenant`
otherwise); another tenant's message or rule is answered as absent (404, word for word); reads
list its tenants' queues, rules and operations only; what has no tenant (a site suspension, the
shaping effects) is 403.

Nothing it is answered tells another tenant's id from one that names nothing: an operation by id
counted globex's message it found as `looked_at: 1` (0 for an id nothing has), and a retry of
`{"domain": "*"}` every row of the spool; the message list's `next`, where a page that ran out of
its scan budget stopped reading, was a globex id. Its cursor is now sealed, and its operations
count its tenant's mail alone."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from pigeon.message import Envelope, Recipient, format_id, parse_id
from pigeon.queue.listing import SCAN_BUDGET
from pigeon.queue.names import scheduled_queue
from pigeon.queue.rules import Selector, standing_rule_id
from pigeon.spool.shards import shard_directory
from pigeon.spool.spool import NewMessage
from pigeon.spool.sqlite import SqliteSpool
from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.services import RedisServer
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

OPS = "ops-token-0123456789"  # admin, read: bound to no tenant (the operator)
ACME = "acme-admin-0123456789"  # admin, read: bound to acme
DUO = "duo-admin-0123456789"  # admin, read: bound to acme and beta
GLOBEX = "globex-admin-0123456789"  # admin, read: bound to globex
TOKENS = [
    {"name": "ops", "token": OPS, "scopes": ["admin", "read"]},
    {"name": "acme-admin", "token": ACME, "scopes": ["admin", "read"], "tenants": ["acme"]},
    {"name": "duo", "token": DUO, "scopes": ["admin", "read"], "tenants": ["acme", "beta"]},
    {"name": "globex-admin", "token": GLOBEX, "scopes": ["admin", "read"], "tenants": ["globex"]},
]


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


def _node(root: Path, sink: ScriptedSink, **sections: Any) -> PigeonProcess:
    # Deferred by the sink and retried in an hour: what is not bounced stays queued.
    config = delivery_config(sink.endpoint, retry_interval="1h")
    return PigeonProcess(root, http={"token": TOKENS}, **config, **sections)


def _inject(node: PigeonProcess, tenant: str, count: int = 1) -> list[str]:
    """`count` messages of `tenant` to tb.test, deferred by the sink: their spool ids."""
    ids = []
    for n in range(count):
        status, answer = node.http_post(
            "/api/v1/inject",
            {
                "envelope_sender": "app@example.org",
                "tenant": tenant,
                "template": False,
                "content": f"From: app@example.org\r\nSubject: {tenant} {n}\r\n\r\nhello\r\n",
                "recipients": [{"email": "tempfail@tb.test"}],
            },
            node.local_token,
        )
        assert (status, answer["accepted"]) == (200, 1), answer
        ids.append(answer["recipients"][0]["id"])
    wait_until(lambda: set(ids) <= {r["id"] for r in node.records("TransientFailure")}, 30)
    return ids


def _api(node: PigeonProcess, method: str, path: str, body: Any = None, token: str = ACME) -> tuple[int, Any]:
    return node.http_call(method, path, body, token)


def _bounced(node: PigeonProcess) -> set[str]:
    return {r["id"] for r in node.records("AdminBounce")}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_token_bound_to_a_tenant_reads_and_acts_on_that_tenants_mail_alone(
    tmp_path: Path, sink: ScriptedSink, workers: int
) -> None:
    with _node(tmp_path / "node", sink, node={"workers": workers}) as node:
        globex = _inject(node, "globex", 5)
        (acme,) = _inject(node, "acme")
        status, held = _api(node, "POST", "/api/v1/admin/suspend", {"domain": "zz.test", "reason": "ops"}, OPS)
        assert status == 200, held
        theirs = held["rule"]["id"]

        # Reads: its tenant's queue alone; no site (every tenant's mail shares them).
        status, queues = _api(node, "GET", "/api/v1/queues")
        assert status == 200, queues
        assert [row["queue"] for row in queues["scheduled"]] == ["acme@tb.test"]
        assert queues["ready"] == []
        assert [row["queue"] for row in _api(node, "GET", "/api/v1/queues", token=OPS)[1]["scheduled"]] == [
            "acme@tb.test",
            "globex@tb.test",
        ]
        # Another tenant's message is none, as an id nothing has is: the answer tells nothing.
        assert _api(node, "GET", f"/api/v1/messages/{globex[0]}") == (
            404,
            {"error": f"no message {globex[0]} here", "field": "id"},
        )
        assert _api(node, "GET", f"/api/v1/messages/{acme}")[1]["tenant"] == "acme"
        assert _api(node, "GET", "/api/v1/admin/suspend") == (200, {"rules": []})

        # Writes naming another tenant, or what has none: refused, nothing done.
        status, refused = _api(node, "POST", "/api/v1/admin/bounce", {"tenant": "globex", "reason": "x"})
        assert (status, refused["field"]) == (403, "$.tenant"), refused
        assert refused["error"].startswith("token 'acme-admin' is bound to tenant acme: "), refused
        assert "not on tenant 'globex'" in refused["error"]
        assert _api(node, "POST", "/api/v1/admin/bounce", {"tenant": "acm*", "reason": "x"})[0] == 403
        assert _api(node, "POST", "/api/v1/admin/suspend", {"tenant": "other"})[0] == 403
        status, refused = _api(node, "POST", "/api/v1/admin/suspend", {"site": "mx.tb.test"})
        assert (status, refused["field"]) == (403, "$.site"), refused
        rebind = {"tenant": "acme", "to_queue": "globex@tb.test"}
        status, refused = _api(node, "POST", "/api/v1/admin/rebind", rebind)
        assert (status, refused["field"]) == (403, "$.to_queue"), refused
        status, refused = _api(node, "POST", "/api/v1/admin/bounce", {"domain": "tb.test"}, DUO)
        assert (status, refused["field"]) == (403, "$.tenant"), refused
        assert "bound to tenants acme, beta: name one of them in tenant" in refused["error"]
        # A body that is refused is refused whole, whoever checks it first: an id that is no id
        # was made one of the binding's own ids before it was checked (200 with 2 workers).
        for refused_body, field in (
            ({"domain": "*", "id": "not an id"}, "$.id"),
            ({"tenant": "globex", "id": 5}, "$.id"),
            ({"tenant": "globex", "via": "curl"}, "$.via"),
        ):
            status, refused = _api(node, "POST", "/api/v1/admin/bounce", {**refused_body, "reason": "x"})
            assert (status, refused["field"]) == (400, field), refused
        # The operator's suspension is none to it: not resumed, and answered as an unknown id.
        assert _api(node, "DELETE", f"/api/v1/admin/suspend/{theirs}") == (
            404,
            {"error": f"no suspension {theirs}", "field": "id", "cancelled": False},
        )
        assert [r["id"] for r in _api(node, "GET", "/api/v1/admin/suspend", token=OPS)[1]["rules"]] == [theirs]
        status, refused = _api(node, "GET", "/api/v1/shaping/effects")
        assert (status, refused["field"]) == (403, "Authorization"), refused
        # Nor the cluster's nodes: they carry every tenant's mail (refused before any look for Redis).
        for method, path in (("GET", "/api/v1/cluster/nodes"), ("DELETE", "/api/v1/cluster/nodes/b")):
            status, refused = _api(node, method, path)
            assert (status, refused["field"]) == (403, "Authorization"), refused
            assert "the cluster's nodes carry the mail of every tenant" in refused["error"]

        # A selector without a tenant is its one tenant's.
        status, own = _api(node, "POST", "/api/v1/admin/suspend", {"domain": "zz.test"})
        assert status == 200, own
        assert own["rule"]["selector"] == {"domain": "zz.test", "tenant": "acme"}
        assert [r["id"] for r in _api(node, "GET", "/api/v1/admin/suspend")[1]["rules"]] == [own["rule"]["id"]]
        assert _api(node, "DELETE", f"/api/v1/admin/suspend/{own['rule']['id']}")[1]["cancelled"] is True
        attempts = {i: _api(node, "GET", f"/api/v1/messages/{i}", token=OPS)[1]["attempts"] for i in globex}
        status, retried = _api(node, "POST", "/api/v1/admin/retry", {"domain": "*"})
        assert (status, retried["made_due"]) == (200, 1), retried
        operations = _api(node, "GET", "/api/v1/admin/operations")[1]["operations"]
        assert {op["selector"]["tenant"] for op in operations} == {"acme"}, operations
        status, bounced = _api(node, "POST", "/api/v1/admin/bounce", {"domain": "tb.test", "reason": "acme's"})
        assert (status, bounced["bounced"]) == (200, 1), bounced
        wait_until(lambda: acme in _bounced(node))

        # Globex's mail is as it was: queued, never bounced, not retried.
        assert not _bounced(node) & set(globex)
        for spool_id in globex:
            status, message = _api(node, "GET", f"/api/v1/messages/{spool_id}", token=OPS)
            assert status == 200, message
            assert message["attempts"] == attempts[spool_id]
        assert set(globex) <= {row["id"] for row in node.spool_messages()}
        # An unbound token still acts on any tenant's mail.
        status, bounced = _api(node, "POST", "/api/v1/admin/bounce", {"tenant": "globex", "reason": "ops"}, OPS)
        assert (status, bounced["bounced"]) == (200, 5), bounced


def test_a_token_bound_to_a_tenant_gets_the_same_refusals_through_the_pigeon_commands(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    with _node(tmp_path / "node", sink) as node:
        (globex,) = _inject(node, "globex")
        (acme,) = _inject(node, "acme")

        def pigeon(*args: str) -> subprocess.CompletedProcess[str]:
            command = [*args, "-c", str(node.config_path), "--token", ACME]
            return zygote.run(command, text=True, timeout=60, check=False)

        done = pigeon("bounce", "--tenant", "globex", "--reason", "x")
        assert done.returncode == 2, done
        assert "pigeon: 403: token 'acme-admin' is bound to tenant acme: " in done.stderr
        assert done.stderr.rstrip().endswith("($.tenant)"), done.stderr
        done = pigeon("rebind", "--domain", "tb.test", "--to-queue", "vip")
        assert done.returncode == 2, done
        assert "pigeon: 403: token 'acme-admin' is bound to tenant acme: to_queue 'vip' " in done.stderr
        assert done.stderr.rstrip().endswith("($.to_queue)"), done.stderr
        done = pigeon("inspect", globex)
        assert (done.returncode, done.stderr) == (2, f"pigeon: 404: no message {globex} here (id)\n"), done
        done = pigeon("queue", "summary", "--json")
        assert done.returncode == 0, done
        assert "acme@tb.test" in done.stdout and "globex" not in done.stdout
        # The operator's suspension of its mail it cannot resume; its own, it can, and is told
        # that another suspension still holds the mail (not which).
        status, held = _api(node, "POST", "/api/v1/admin/suspend", {"tenant": "acme", "reason": "ABUSE"}, OPS)
        assert status == 200, held
        theirs = held["rule"]["id"]
        done = pigeon("resume", theirs)
        assert (done.returncode, done.stderr) == (2, f"pigeon: 404: no suspension {theirs} (id)\n"), done
        done = pigeon("suspend", "--domain", "tb.test", "--json")
        assert done.returncode == 0, done
        own = json.loads(done.stdout)["rule"]["id"]
        done = pigeon("resume", own)
        assert done.returncode == 0, done
        assert done.stdout == "resumed: 0 messages due now; 1 message left held by another suspension " \
            "(`pigeon suspend --list`)\n"  # fmt: skip
        assert theirs not in done.stdout
        # Nor can it move the mail out from under it: left in place, and said so (not which).
        done = pigeon("rebind", "--domain", "tb.test", "--to-queue", "x:acme@tb.test")
        assert done.returncode == 0, done
        assert done.stdout == "rebound 0 messages (0 once their attempt under way ends); 1 message left in place, " \
            "held by a suspension or standing bounce this token cannot end (`pigeon suspend --list`)\n"  # fmt: skip
        assert _api(node, "DELETE", f"/api/v1/admin/suspend/{theirs}", token=OPS)[0] == 200
        done = pigeon("bounce", "--domain", "tb.test", "--reason", "acme's")
        assert done.returncode == 0, done
        wait_until(lambda: acme in _bounced(node))
        assert globex not in _bounced(node)


# Acme's mail leaves from 127.0.0.2 at most once a minute; globex has 127.0.0.3 to itself, for
# its queues and for `vip` (no rate). A bound token's rebind must not reach either block.
POOLED = {
    "source": [{"name": "acme-ip", "bind": "127.0.0.2"}, {"name": "globex-ip", "bind": "127.0.0.3"}],
    "pool": [{"name": "acme-pool", "sources": ["acme-ip"]}, {"name": "globex-pool", "sources": ["globex-ip"]}],
    "queue": [
        {"name": "*:globex@*", "pool": "globex-pool"},
        {"name": "globex@*", "pool": "globex-pool"},
        {"name": "vip", "pool": "globex-pool"},
        {"name": "*acme@*", "pool": "acme-pool", "max_message_rate": "1/m"},
    ],
}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_token_bound_to_a_tenant_cannot_rebind_its_mail_into_another_tenants_egress_pool(
    tmp_path: Path, sink: ScriptedSink, workers: int
) -> None:
    config = delivery_config(sink.endpoint, retry_interval="1h", pool="acme-pool")
    before = len(sink.connections)  # the sink's own check that it listens
    node = PigeonProcess(tmp_path / "node", http={"token": TOKENS}, node={"workers": workers}, tables=POOLED, **config)
    with node:
        status, answer = node.http_post(
            "/api/v1/inject",
            {
                "envelope_sender": "app@example.org",
                "tenant": "acme",
                "campaign": "pooltest",
                "template": False,
                "content": "From: app@example.org\r\nSubject: pooled\r\n\r\nhello\r\n",
                "recipients": [{"email": "tempfail@pool.test"}],
            },
            node.local_token,
        )
        assert (status, answer["accepted"]) == (200, 1), answer
        spool_id = answer["recipients"][0]["id"]

        def attempts() -> list[tuple[str, str]]:
            return [(r["queue"], r["source"]) for r in node.records("TransientFailure") if r["id"] == spool_id]

        wait_until(lambda: len(attempts()) == 1, 30)
        assert attempts() == [("pooltest:acme@pool.test", "acme-ip")]

        # Names `*:globex@*` or `vip` govern, and no part reading sees as globex's (or as any
        # tenant's): refused, 403 naming to_queue; nothing moved.
        refused_names = [
            "a:b:globex@pool.test",
            ":globex@pool.test",
            "globex@x@pool.test",
            "@pool.test",
            "vip",
            "globex",
            "globex@pool.test",
        ]
        for to_queue in refused_names:
            rebind = {"queue": "pooltest:acme@pool.test", "to_queue": to_queue}
            status, refused = _api(node, "POST", "/api/v1/admin/rebind", rebind)
            assert (status, refused.get("field")) == (403, "$.to_queue"), (to_queue, refused)
            assert refused["error"].startswith(f"token 'acme-admin' is bound to tenant acme: to_queue {to_queue!r} ")
            assert "move it to a queue of its tenant" in refused["error"], refused
        status, refused = _api(node, "POST", "/api/v1/admin/rebind", {"domain": "*", "to_queue": "acme@x_y"})
        assert (status, refused["field"]) == (400, "$.to_queue"), refused
        status, message = _api(node, "GET", f"/api/v1/messages/{spool_id}")
        assert (status, message["queue"], message["attempts"]) == (200, "pooltest:acme@pool.test", 1), message

        # A queue of its own tenant is taken: the mail still leaves from acme's address.
        rebind = {"queue": "pooltest:acme@pool.test", "to_queue": "moved:acme@pool.test"}
        status, rebound = _api(node, "POST", "/api/v1/admin/rebind", rebind)
        assert (status, rebound["rebound"]) == (200, 1), rebound
        wait_until(lambda: len(attempts()) == 2, 30)
        assert attempts()[1] == ("moved:acme@pool.test", "acme-ip")

        # The operator (a token bound to no tenant) may still move it anywhere, and the config
        # does send such a name from globex's address: what the refusals above kept it from.
        rebind = {"queue": "moved:acme@pool.test", "to_queue": "a:b:globex@pool.test"}
        status, rebound = _api(node, "POST", "/api/v1/admin/rebind", rebind, OPS)
        assert (status, rebound["rebound"]) == (200, 1), rebound
        wait_until(lambda: len(attempts()) == 3, 30)
        assert attempts()[2] == ("a:b:globex@pool.test", "globex-ip")
        peers = {connection.peer for connection in sink.connections[before:]}
        assert peers == {"127.0.0.2", "127.0.0.3"}, peers


@pytest.mark.parametrize("workers", [1, 2])
def test_a_token_bound_to_a_tenant_finds_another_tenants_message_named_by_id_as_none(
    tmp_path: Path, sink: ScriptedSink, workers: int
) -> None:
    with _node(tmp_path / "node", sink, node={"workers": workers}) as node:
        (globex,) = _inject(node, "globex")
        (acme,) = _inject(node, "acme")
        for action in ("bounce", "retry", "hold"):
            # Its own message, not selected by the domain given with it: said so.
            status, answer = _api(node, "POST", f"/api/v1/admin/{action}", {"messages": [acme], "domain": "zz.test"})
            assert status == 200, answer
            assert answer["messages"] == [{"id": acme, "result": "not_selected", "unmatched": ["domain"]}]
            # Another tenant's, whatever else misses it too: as an id nothing has, word for word.
            for selector in ({}, {"domain": "zz.test"}):
                status, answer = _api(node, "POST", f"/api/v1/admin/{action}", {"messages": [globex], **selector})
                assert status == 200, answer
                assert answer["messages"] == [{"id": globex, "result": "not_found"}]
        # The operator is told why: its tenant is not the one given.
        status, answer = _api(node, "POST", "/api/v1/admin/bounce", {"messages": [globex], "tenant": "acme"}, OPS)
        assert answer["messages"] == [{"id": globex, "result": "not_selected", "unmatched": ["tenant"]}]
        assert _bounced(node) == set()


def _no_such(kind: str, rule_id: str) -> tuple[int, Any]:
    """The answer to a cancel of an id nothing has."""
    what = "standing bounce" if kind == "bounce" else "suspension"
    return 404, {"error": f"no {what} {rule_id}", "field": "id", "cancelled": False}


def _suspended_by(node: PigeonProcess, spool_id: str) -> Any:
    return _api(node, "GET", f"/api/v1/messages/{spool_id}", token=OPS)[1]["suspended_by"]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_token_bound_to_a_tenant_cannot_end_the_operators_suspension_or_bounce_of_its_tenants_mail(
    tmp_path: Path, sink: ScriptedSink, workers: int
) -> None:
    # It could: the operator's rule named its tenant, and that was all it asked of a rule.
    with _node(tmp_path / "node", sink, node={"workers": workers}) as node:
        acme = _inject(node, "acme", 2)
        status, held = _api(node, "POST", "/api/v1/admin/suspend", {"tenant": "acme", "reason": "ABUSE"}, OPS)
        assert (status, held["held"]) == (200, 2), held
        theirs = held["rule"]["id"]
        standing = {"tenant": "acme", "domain": "victim.test", "duration": "1d", "reason": "ABUSE"}
        status, bounce = _api(node, "POST", "/api/v1/admin/bounce", standing, OPS)
        assert status == 200, bounce

        # It sees why its mail waits (the rules name its tenant), and that they are not its own...
        listed = _api(node, "GET", "/api/v1/admin/suspend")[1]["rules"]
        assert [(rule["id"], rule.get("bound_to")) for rule in listed] == [(theirs, None)]
        # ... and cannot end them: answered as ids nothing has, word for word. Neither can a
        # token bound to acme and another tenant.
        for token in (ACME, DUO):
            assert _api(node, "DELETE", f"/api/v1/admin/suspend/{theirs}", token=token) == _no_such("suspend", theirs)
            assert _api(node, "DELETE", "/api/v1/admin/suspend/0123456789ab", token=token) == _no_such(
                "suspend", "0123456789ab"
            )
            cancel = f"/api/v1/admin/bounce/{bounce['rule']['id']}"
            assert _api(node, "DELETE", cancel, token=token) == _no_such("bounce", bounce["rule"]["id"])
        assert [r["id"] for r in _api(node, "GET", "/api/v1/admin/suspend", token=OPS)[1]["rules"]] == [theirs]
        assert [r["id"] for r in _api(node, "GET", "/api/v1/admin/bounce", token=OPS)[1]["rules"]] == [
            bounce["rule"]["id"]
        ]

        # The same suspension asked for by acme is its own, not the operator's answered back:
        # resuming it leaves the operator's holding the mail, and says so without naming it.
        status, own = _api(node, "POST", "/api/v1/admin/suspend", {"tenant": "acme", "reason": "mine"})
        assert status == 200, own
        assert own["already"] is False
        assert own["rule"]["id"] != theirs
        assert (own["rule"]["selector"], own["rule"]["bound_to"]) == ({"tenant": "acme"}, ["acme"])
        status, resumed = _api(node, "DELETE", f"/api/v1/admin/suspend/{own['rule']['id']}")
        assert (status, resumed["cancelled"], resumed["made_due"], resumed["suspended"]) == (200, True, 0, 2), resumed
        assert theirs not in json.dumps(resumed)
        assert {_suspended_by(node, spool_id) for spool_id in acme} == {theirs}

        # A rule of a token bound to acme alone is within reach of one bound to acme and more.
        status, own = _api(node, "POST", "/api/v1/admin/suspend", {"domain": "yy.test"})
        assert status == 200, own
        status, resumed = _api(node, "DELETE", f"/api/v1/admin/suspend/{own['rule']['id']}", token=DUO)
        assert (status, resumed["cancelled"]) == (200, True), resumed

        # The operator ends its own as before.
        status, resumed = _api(node, "DELETE", f"/api/v1/admin/suspend/{theirs}", token=OPS)
        assert (status, resumed["cancelled"], resumed["made_due"]) == (200, True, 2), resumed
        assert "suspended" not in resumed


@pytest.mark.parametrize("workers", [1, 2])
def test_an_id_a_bound_token_gives_tells_it_nothing_of_another_tenants_rules(
    tmp_path: Path, sink: ScriptedSink, workers: int
) -> None:
    # A suspension's id is computed from its selector: acme gave globex's as the id of a rule of
    # its own, and a 409 said that globex was suspended.
    with _node(tmp_path / "node", sink, node={"workers": workers}) as node:
        theirs = []
        for token in (OPS, GLOBEX):
            status, held = _api(node, "POST", "/api/v1/admin/suspend", {"tenant": "globex", "domain": "*"}, token)
            assert status == 200, held
            theirs.append(held["rule"]["id"])
        assert theirs[0] == standing_rule_id("suspend", Selector(domain="*", tenant="globex"))
        status, made = _api(node, "POST", "/api/v1/admin/bounce", {"tenant": "globex", "duration": "1h"}, OPS)
        theirs.append(made["rule"]["id"])

        for probe in (*theirs, "nothing-has-it"):
            status, retried = _api(node, "POST", "/api/v1/admin/retry", {"domain": "*", "id": probe})
            assert status == 200, retried
            assert retried["operation"] not in theirs
            request = {"domain": "*", "duration": "1m", "id": probe}
            status, own = _api(node, "POST", "/api/v1/admin/suspend", request)
            assert (status, own["already"]) == (200, False), own
            assert own["rule"]["id"] not in theirs
            # Sent again: the same rule (the id a key for sending it again safely, as before).
            status, again = _api(node, "POST", "/api/v1/admin/suspend", request)
            assert (status, again["already"], again["rule"]["id"]) == (200, True, own["rule"]["id"]), again
        listed = [rule["id"] for rule in _api(node, "GET", "/api/v1/admin/suspend", token=OPS)[1]["rules"]]
        assert set(theirs[:2]) <= set(listed) and len(listed) == 6

        # The operator's ids are as they were: an id it gives is the rule's, and another's is 409.
        status, made = _api(node, "POST", "/api/v1/admin/suspend", {"domain": "x.test", "id": theirs[2]}, OPS)
        assert (status, made["rule"]["id"]) == (200, standing_rule_id("suspend", Selector(domain="x.test"))), made
        request = {"domain": "x.test", "duration": "1m", "id": theirs[0]}
        status, refused = _api(node, "POST", "/api/v1/admin/suspend", request, OPS)
        assert (status, refused["field"], refused["rule"]["id"]) == (409, "$.id", theirs[0]), refused
        status, made = _api(node, "POST", "/api/v1/admin/suspend", {**request, "id": "ops-own"}, OPS)
        assert (status, made["rule"]["id"]) == (200, "ops-own"), made


def test_which_tokens_reach_a_rule_is_kept_across_a_restart(tmp_path: Path, sink: ScriptedSink) -> None:
    node = _node(tmp_path / "node", sink)
    with node:
        status, own = _api(node, "POST", "/api/v1/admin/suspend", {"domain": "zz.test"})
        assert status == 200, own
        status, held = _api(node, "POST", "/api/v1/admin/suspend", {"tenant": "acme", "domain": "yy.test"}, OPS)
        assert status == 200, held
    with node:
        assert _api(node, "DELETE", f"/api/v1/admin/suspend/{held['rule']['id']}") == _no_such(
            "suspend", held["rule"]["id"]
        )
        status, resumed = _api(node, "DELETE", f"/api/v1/admin/suspend/{own['rule']['id']}")
        assert (status, resumed["cancelled"]) == (200, True), resumed


@pytest.fixture
def cluster(tmp_path: Path, sink: ScriptedSink, redis_server: RedisServer) -> Iterator[tuple[PigeonProcess, ...]]:
    with ExitStack() as stack:
        nodes = []
        for name, workers in (("a", 1), ("b", 2)):
            redis = {"url": redis_server.url, "timeout": "1s"}
            node = _node(tmp_path / name, sink, node={"name": name, "workers": workers}, redis=redis)
            nodes.append(stack.enter_context(node))
        yield tuple(nodes)


def test_a_token_bound_to_a_tenant_reaches_that_tenants_mail_alone_on_every_node(
    cluster: tuple[PigeonProcess, PigeonProcess],
) -> None:
    a, b = cluster
    globex = {node.config["node"]["name"]: _inject(node, "globex", 2) for node in cluster}
    (acme,) = _inject(a, "acme")
    for asked in cluster:
        status, queues = _api(asked, "GET", "/api/v1/queues?cluster=1")
        assert status == 200, queues
        assert [(row["queue"], row["messages"]) for row in queues["scheduled"]] == [("acme@tb.test", 1)]
        status, refused = _api(asked, "POST", "/api/v1/admin/bounce", {"tenant": "globex"})
        assert (status, refused["field"]) == (403, "$.tenant"), refused
        # Into a queue a [[queue]] block for globex's names would govern: refused where asked,
        # before any node is told.
        status, refused = _api(asked, "POST", "/api/v1/admin/rebind", {"domain": "*", "to_queue": "a:b:globex@tb.test"})
        assert (status, refused.get("field")) == (403, "$.to_queue"), refused
    # Issued on b (its supervisor), confined there: a bounces acme's mail alone.
    status, bounced = _api(b, "POST", "/api/v1/admin/bounce", {"domain": "*", "reason": "acme's"})
    assert (status, bounced["bounced"]) == (200, 1), bounced
    wait_until(lambda: acme in _bounced(a))
    status, own = _api(a, "POST", "/api/v1/admin/suspend", {"domain": "tb.test"})
    assert status == 200, own
    assert own["rule"]["selector"] == {"domain": "tb.test", "tenant": "acme"}
    status, theirs = _api(b, "POST", "/api/v1/admin/suspend", {"domain": "zz.test"}, OPS)
    assert status == 200, theirs
    for asked in cluster:
        status, listed = _api(asked, "GET", "/api/v1/admin/suspend?cluster=1")
        assert [rule["id"] for rule in listed["rules"]] == [own["rule"]["id"]], listed
        assert list(listed["cluster"]["held_by"]) == [own["rule"]["id"]], listed
        assert _api(asked, "DELETE", f"/api/v1/admin/suspend/{theirs['rule']['id']}")[0] == 404
    for node in cluster:
        ids = globex[node.config["node"]["name"]]
        assert not _bounced(node) & set(ids)
        assert set(ids) <= {row["id"] for row in node.spool_messages()}
    assert not [record for node in cluster for record in node.records("Rebind")]
    # The operator's suspension of acme's mail, made on b, is out of acme's reach on every node;
    # acme's own, made on a, is its own on b too (which of them it reaches goes with the rule).
    status, operators = _api(b, "POST", "/api/v1/admin/suspend", {"tenant": "acme", "domain": "yy.test"}, OPS)
    assert status == 200, operators
    for asked in cluster:
        rule_id = operators["rule"]["id"]
        assert _api(asked, "DELETE", f"/api/v1/admin/suspend/{rule_id}") == _no_such("suspend", rule_id)
    status, resumed = _api(b, "DELETE", f"/api/v1/admin/suspend/{own['rule']['id']}")
    assert (status, resumed["cancelled"]) == (200, True), resumed


def _nowhere(spool_id: str) -> str:
    """An id of the same shard as `spool_id` that names no message: made 1000 s before it,
    before the node started."""
    return format_id(parse_id(spool_id) - (1000_000 << 22))


def _as_seen(answer: Any, spool_id: str) -> str:
    """An answer with the id asked about (echoed in it) and what differs from one operation to
    the next (its id, its times) written alike: what is left must be the same, word for word."""
    text = json.dumps(answer, sort_keys=True).replace(spool_id, "ID")
    return re.sub(r'"(operation|started|finished)": [^,}]+', r'"\1": "-"', text)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_operation_on_another_tenants_message_by_id_says_what_one_on_an_id_nothing_has_says(
    tmp_path: Path, sink: ScriptedSink, workers: int
) -> None:
    with _node(tmp_path / "node", sink, node={"workers": workers}) as node:
        globex = _inject(node, "globex", 3)
        (acme,) = _inject(node, "acme")
        nowhere = _nowhere(globex[0])
        assert _api(node, "GET", f"/api/v1/messages/{nowhere}", token=OPS)[0] == 404
        for action in ("retry", "hold", "bounce"):
            seen = []
            for spool_id in (globex[0], nowhere):
                status, answer = _api(node, "POST", f"/api/v1/admin/{action}", {"messages": [spool_id]})
                assert status == 200, answer
                (progress,) = [
                    op
                    for op in _api(node, "GET", "/api/v1/admin/operations")[1]["operations"]
                    if op["operation"] == answer["operation"]
                ]
                assert progress["looked_at"] == 0, progress  # (1 for globex's: its message exists)
                # Whole seconds: to the microsecond, globex's took 10-40 times as long as none's.
                # (Its length in whole seconds, rounded up: 2 when a loaded machine made it take over 1.)
                assert isinstance(progress["started"], int), progress
                assert progress["finished"] - progress["started"] in (1, 2), progress
                seen.append((_as_seen(answer, spool_id), _as_seen(progress, spool_id)))
            assert seen[0] == seen[1], f"{action}: another tenant's id is told apart from none"
        # A selector's operation counts its tenant's mail, not the spool's: 1, not 4.
        status, retried = _api(node, "POST", "/api/v1/admin/retry", {"domain": "*"})
        assert status == 200, retried
        (progress,) = [
            op
            for op in _api(node, "GET", "/api/v1/admin/operations")[1]["operations"]
            if op["operation"] == retried["operation"]
        ]
        assert (progress["looked_at"], progress["acted_on"]) == (1, 1), progress
        status, retried = _api(node, "POST", "/api/v1/admin/retry", {"domain": "*"}, OPS)  # the operator's: all
        (progress,) = [
            op
            for op in _api(node, "GET", "/api/v1/admin/operations", token=OPS)[1]["operations"]
            if op["operation"] == retried["operation"]
        ]
        assert progress["looked_at"] == 4, progress
        assert progress["finished"] - progress["started"] < 1, progress  # (the operator's: as precise as taken)
        assert not _bounced(node) & set(globex)
        assert acme not in _bounced(node)


def _fill(spool_root: Path, tenant: str, count: int) -> list[str]:
    """`count` deferred messages of `tenant` in shard 0 (due in an hour), written through the
    spool API before the node starts (receiving them would take minutes): their ids."""

    async def write() -> list[str]:
        spool = SqliteSpool(shard_directory(spool_root, 0), shard=0, max_batch=4096)
        spool.open(asyncio.get_running_loop())
        now = time.time()
        queue = scheduled_queue("tb.test", tenant, "")
        stored, ids = [], []
        for spool_id in spool.new_ids(count):
            writer = spool.body_writer(spool_id)
            writer.write(b"Subject: hi\r\n\r\nhello\r\n")
            recipients = [Recipient("u@tb.test")]
            envelope = Envelope("app@example.org", recipients, peer="127.0.0.1", helo="test", tenant=tenant)
            message = NewMessage(spool_id, queue, envelope, created=now, due=now + 3600)
            stored.append(spool.store(writer.finish(), [message]))
            ids.append(format_id(spool_id))
        try:
            await asyncio.gather(*stored)
        finally:
            spool.close()
        return ids

    return asyncio.run(write())


@pytest.mark.parametrize("workers", [1, 2])
def test_a_token_bound_to_a_tenant_pages_by_a_cursor_that_names_no_other_tenants_message(
    tmp_path: Path, sink: ScriptedSink, workers: int
) -> None:
    # More of globex's mail than a page reads (`SCAN_BUDGET`): acme's first page ends short,
    # where it stopped reading, on a message of globex's, which `next` named.
    globex = set(_fill(tmp_path / "node" / "spool", "globex", SCAN_BUDGET + 100))
    with _node(tmp_path / "node", sink, node={"workers": workers}) as node:
        acme = _inject(node, "acme", 2)
        status, page = _api(node, "GET", "/api/v1/messages")
        assert status == 200, page
        assert page["messages"] == [] and page["next"] is not None, page
        assert page["next"] not in globex and re.fullmatch(r"[0-9a-f]{48}", page["next"]), page
        # Paging on with it, as given, lists acme's mail: stable, the same cursor each time.
        assert _api(node, "GET", "/api/v1/messages")[1]["next"] == page["next"]
        listed: list[str] = []
        cursor = page["next"]
        while cursor is not None:
            status, page = _api(node, "GET", f"/api/v1/messages?after={cursor}")
            assert status == 200, page
            assert page["next"] is None or page["next"] not in globex, page
            listed += [m["id"] for m in page["messages"]]
            cursor = page["next"]
        assert listed == acme

        # Forged, an id (globex's, or none's), altered, or another binding's: one refusal, word
        # for word, whatever it names.
        first = _api(node, "GET", "/api/v1/messages")[1]["next"]
        altered = first[:-1] + ("0" if first[-1] != "0" else "1")
        duo_cursor = _api(node, "GET", "/api/v1/messages", token=DUO)[1]["next"]
        assert duo_cursor is not None and duo_cursor != first
        refusals = {
            json.dumps(_api(node, "GET", f"/api/v1/messages?after={after}"))
            for after in (min(globex), _nowhere(min(globex)), altered, "0" * 48, duo_cursor)
        }
        assert len(refusals) == 1, refusals
        status, refused = json.loads(refusals.pop())
        assert (status, refused["field"]) == (400, "after"), refused

        # The operator pages by message id, as before.
        status, page = _api(node, "GET", "/api/v1/messages?limit=5", token=OPS)
        assert status == 200, page
        assert page["next"] == page["messages"][-1]["id"] and page["next"] in globex
        status, page = _api(node, "GET", f"/api/v1/messages?limit=5&after={page['next']}", token=OPS)
        assert status == 200 and len(page["messages"]) == 5, page


@pytest.mark.parametrize("via", ["curl", {}])
def test_a_token_bound_to_a_tenant_cannot_reach_another_node_unconfined_by_a_via_the_schema_does_not_take(
    cluster: tuple[PigeonProcess, PigeonProcess], via: Any
) -> None:
    """The supervisor confines a write after checking it, and passed on one it found invalid for
    each worker to refuse; `via` made it valid after (replaced with "api"), so the other nodes
    were told the write unconfined: acme's token bounced globex's mail on node a."""
    a, b = cluster
    globex = _inject(a, "globex")
    status, refused = _api(b, "POST", "/api/v1/admin/bounce", {"domain": "*", "reason": "acme's", "via": via})
    assert (status, refused.get("field")) == (400, "$.via"), refused
    time.sleep(2)
    assert not _bounced(a) & set(globex)
    assert set(globex) <= {row["id"] for row in a.spool_messages()}


@pytest.mark.parametrize(("held_by", "workers"), [({"queue": "c1:acme@tb.test"}, 1), ({"campaign": "c1"}, 2)])
def test_a_token_bound_to_a_tenant_cannot_rebind_its_mail_out_from_under_the_operators_suspension(
    tmp_path: Path, sink: ScriptedSink, held_by: dict[str, str], workers: int
) -> None:
    """Selectors match a message's queue as it is now: moved within its own tenant, acme's mail
    left the operator's suspension of its queue (or campaign) behind (`suspended_by` null) and
    was delivered. It is left where it is, held, and the answer counts it."""
    with _node(tmp_path / "node", sink, node={"workers": workers}) as node:
        status, held = _api(node, "POST", "/api/v1/admin/suspend", {**held_by, "reason": "ABUSE"}, OPS)
        assert status == 200, held
        theirs = held["rule"]["id"]
        status, answer = node.http_post(
            "/api/v1/inject",
            {
                "envelope_sender": "app@example.org",
                "tenant": "acme",
                "campaign": "c1",
                "template": False,
                "content": "From: app@example.org\r\nSubject: held\r\n\r\nhello\r\n",
                "recipients": [{"email": "ok@tb.test"}],
            },
            node.local_token,
        )
        assert (status, answer["accepted"]) == (200, 1), answer
        spool_id = answer["recipients"][0]["id"]
        wait_until(lambda: _suspended_by(node, spool_id) == theirs, 30)

        # Its own suspension beside the operator's changes nothing: the operator's holds.
        status, own = _api(node, "POST", "/api/v1/admin/suspend", {"campaign": "c1", "reason": "mine"})
        assert status == 200, own
        for to_queue in ("x:acme@tb.test", "acme@tb.test"):
            status, rebound = _api(node, "POST", "/api/v1/admin/rebind", {"domain": "*", "to_queue": to_queue})
            assert status == 200, rebound
            assert (rebound["rebound"], rebound["held_left"]) == (0, 1), rebound
            assert theirs not in json.dumps(rebound)
        status, message = _api(node, "GET", f"/api/v1/messages/{spool_id}", token=OPS)
        assert (message["queue"], message["suspended_by"]) == ("c1:acme@tb.test", theirs), message
        assert sink.after(3) == []
        assert not node.records("Delivery")

        # Once the operator resumes its own, the token's rebind moves what only its own holds.
        status, resumed = _api(node, "DELETE", f"/api/v1/admin/suspend/{theirs}", token=OPS)
        assert (status, resumed["cancelled"]) == (200, True), resumed
        status, rebound = _api(node, "POST", "/api/v1/admin/rebind", {"domain": "*", "to_queue": "x:acme@tb.test"})
        assert (status, rebound["rebound"], rebound["held_left"]) == (200, 1, 0), rebound
        sink.wait_for(1, 30)
        assert [r["queue"] for r in node.wait_records("Delivery")] == ["x:acme@tb.test"]


def test_a_node_confines_a_bound_tokens_write_it_reads_from_the_cluster_or_refuses_it(
    cluster: tuple[PigeonProcess, PigeonProcess], redis_server: RedisServer
) -> None:
    """Every node carried out what the stream told it as it was: a bound token's write was only
    as confined as the node asked made it (a step there that made an invalid body valid after
    its check sent acme's bounce of globex's mail to the other nodes unconfined). Each node now
    confines such a write itself, or refuses it: here, entries written to the stream as no node
    would write them, unconfined, under acme's token."""
    a, b = cluster
    globex = [spool_id for node in cluster for spool_id in _inject(node, "globex")]
    (acme,) = _inject(a, "acme")
    status, held = _api(b, "POST", "/api/v1/admin/suspend", {"tenant": "acme", "domain": "yy.test"}, OPS)
    assert status == 200, held
    theirs = held["rule"]["id"]
    forged = [
        # Its tenant left out (bound_to says whose it is): confined here to acme's mail.
        ("POST", "/api/v1/admin/bounce", {"domain": "*", "reason": "forged", "via": "api", "bound_to": ["acme"]}),
        # Another tenant's: refused.
        ("POST", "/api/v1/admin/bounce", {"tenant": "globex", "reason": "forged", "via": "api", "bound_to": ["acme"]}),
        # No bound_to, but the token is acme's on this node too: refused ...
        ("POST", "/api/v1/admin/bounce", {"tenant": "globex", "reason": "forged", "via": "api"}),
        # ... and so is a bound_to that names no tenants (400: it is no list of them).
        ("POST", "/api/v1/admin/bounce", {"tenant": "globex", "reason": "forged", "via": "api", "bound_to": "x"}),
        # The operator's suspension of acme's mail, out of the token's reach: as if there were none.
        ("DELETE", f"/api/v1/admin/suspend/{theirs}", None),
    ]
    client = redis_server.client()
    answers = []
    try:
        for n, (method, path, body) in enumerate(forged):
            op = f"forged{n}"
            fields = {"op": op, "origin": "0" * 16, "node": "forged", "method": method, "path": path}
            fields |= {"body": json.dumps({**body, "id": f"forged{n}"}) if body else "", "operator": "acme-admin"}
            client.xadd("pigeon:admin:stream", {**fields, "time": repr(time.time())})
            # One answer from each worker of each node (a: 1, b: 2).
            key = f"pigeon:admin:answers:{op}"
            replies = wait_until(lambda key=key: len(got := client.lrange(key, 0, -1)) == 3 and got)
            said = [json.loads(reply) for reply in replies]
            answers.append(sorted((r["node"], r["status"], r["answer"].get("field")) for r in said))
    finally:
        client.close()
    assert answers[0] == [("a", 200, None), ("b", 200, None), ("b", 200, None)]
    for refused in answers[1:3]:
        assert refused == [("a", 403, "$.tenant"), ("b", 403, "$.tenant"), ("b", 403, "$.tenant")], answers
    assert answers[3] == [("a", 400, "$.bound_to"), ("b", 400, "$.bound_to"), ("b", 400, "$.bound_to")], answers
    assert answers[4] == [("a", 404, "id"), ("b", 404, "id"), ("b", 404, "id")], answers
    wait_until(lambda: acme in _bounced(a))
    for node in cluster:
        assert not _bounced(node) & set(globex)
        assert [r["id"] for r in _api(node, "GET", "/api/v1/admin/suspend", token=OPS)[1]["rules"]] == [theirs]
    assert set(globex) <= {row["id"] for node in cluster for row in node.spool_messages()}
