"""A token bound to tenants (`[[http.token]] tenants`) reaches those tenants' mail alone, at every
endpoint, through a node's one worker, a supervisor of several, the `pigeon` commands and a
cluster: it listed globex's queues, inspected its messages and bounced them all (5 AdminBounce
records under `acme-admin`), resumed the operator's suspension and retried every domain's mail.

Its writes name one of its tenants (filled in for a token of one tenant; 403 naming `$.tenant`
otherwise); another tenant's message or rule is answered as absent (404, word for word); reads
list its tenants' queues, rules and operations only; what has no tenant (a site suspension, the
shaping effects) is 403."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.services import RedisServer
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

OPS = "ops-token-0123456789"  # admin, read: bound to no tenant (the operator)
ACME = "acme-admin-0123456789"  # admin, read: bound to acme
DUO = "duo-admin-0123456789"  # admin, read: bound to acme and beta
TOKENS = [
    {"name": "ops", "token": OPS, "scopes": ["admin", "read"]},
    {"name": "acme-admin", "token": ACME, "scopes": ["admin", "read"], "tenants": ["acme"]},
    {"name": "duo", "token": DUO, "scopes": ["admin", "read"], "tenants": ["acme", "beta"]},
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
        # The operator's suspension is none to it: not resumed, and answered as an unknown id.
        assert _api(node, "DELETE", f"/api/v1/admin/suspend/{theirs}") == (
            404,
            {"error": f"no suspension {theirs}", "field": "id", "cancelled": False},
        )
        assert [r["id"] for r in _api(node, "GET", "/api/v1/admin/suspend", token=OPS)[1]["rules"]] == [theirs]
        status, refused = _api(node, "GET", "/api/v1/shaping/effects")
        assert (status, refused["field"]) == (403, "Authorization"), refused

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
            command = [sys.executable, "-m", "pigeon", *args, "-c", str(node.config_path), "--token", ACME]
            return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

        done = pigeon("bounce", "--tenant", "globex", "--reason", "x")
        assert done.returncode == 2, done
        assert "pigeon: 403: token 'acme-admin' is bound to tenant acme: " in done.stderr
        assert done.stderr.rstrip().endswith("($.tenant)"), done.stderr
        done = pigeon("inspect", globex)
        assert (done.returncode, done.stderr) == (2, f"pigeon: 404: no message {globex} here (id)\n"), done
        done = pigeon("queue", "summary", "--json")
        assert done.returncode == 0, done
        assert "acme@tb.test" in done.stdout and "globex" not in done.stdout
        done = pigeon("bounce", "--domain", "tb.test", "--reason", "acme's")
        assert done.returncode == 0, done
        wait_until(lambda: acme in _bounced(node))
        assert globex not in _bounced(node)


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
