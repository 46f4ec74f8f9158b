"""A token bound to tenants rebinds its tenants' mail only to be routed by its recipients' own
domains, or by a routing domain the operator gave it (`[[http.token]] routing_domains`).

A rebind's `routing_domain` routes mail as if its recipients were in that domain: by that
domain's `[[route]]` (next hop, TLS, the smart host's AUTH user and password) and its
`[[shaping]]`. `acme-admin` rebound acme's mail with `routing_domain = "globex-relay.test"`, and
it left through globex's smart-host account, authenticated as globex: a route the operator wrote
for another customer, with that customer's credentials. Now 403 naming `$.routing_domain`, on one
worker, a supervisor of several, the `pigeon` command and a cluster; the operator's tokens
(bound to no tenant) rebind as before, and a domain the operator lists for the token is taken.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from pigeon.listener.tls import ensure_self_signed
from pigeon.tls import server_context
from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.services import RedisServer
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

OPS = "ops-token-0123456789"  # admin, read: bound to no tenant (the operator)
ACME = "acme-admin-0123456789"  # admin, read: bound to acme; may route as acme-relay.test
GLOBEX_PASSWORD = "gl0bex-relay-Passw0rd"
ACME_PASSWORD = "acme-relay-Passw0rd"
TOKENS = [
    {"name": "ops", "token": OPS, "scopes": ["admin", "read"]},
    {
        "name": "acme-admin",
        "token": ACME,
        "scopes": ["admin", "read"],
        "tenants": ["acme"],
        "routing_domains": ["acme-relay.test"],
    },
]


def _context(directory: Path) -> ssl.SSLContext:
    certificate, key = ensure_self_signed(directory, "relay.test")
    return server_context(certificate, key)


@pytest.fixture
def sinks(tmp_path: Path) -> Iterator[tuple[ScriptedSink, ScriptedSink]]:
    """The ordinary next hop, which defers everything (mail stays queued, to be rebound), and
    the smart host where globex and acme each have an account."""
    users = {"globex": GLOBEX_PASSWORD, "acme": ACME_PASSWORD}
    with ScriptedSink() as ordinary, ScriptedSink(tls=_context(tmp_path / "tls"), users=users) as relay:
        ordinary.rcpt_reply = lambda address: "451 4.3.0 try again later"
        yield ordinary, relay


def _config(tmp_path: Path, ordinary: ScriptedSink, relay: ScriptedSink) -> dict[str, Any]:
    config = delivery_config(ordinary.endpoint, retry_interval="1h")
    for user, password in (("globex", GLOBEX_PASSWORD), ("acme", ACME_PASSWORD)):
        (tmp_path / f"{user}-password").write_text(password + "\n")
    relay_route = {"next_hop": relay.endpoint, "tls": "required"}
    config["route"] = [
        # The operator's routes for each customer's relay account: domains no mail is addressed
        # to, only rebound to.
        {"domain": "globex-relay.test", **relay_route, "auth_username": "globex",
         "auth_password_file": str(tmp_path / "globex-password")},
        {"domain": "acme-relay.test", **relay_route, "auth_username": "acme",
         "auth_password_file": str(tmp_path / "acme-password")},
        *config["route"],
    ]  # fmt: skip
    return config


def _inject(node: PigeonProcess, tenant: str) -> str:
    status, answer = node.http_post(
        "/api/v1/inject",
        {
            "envelope_sender": "app@example.org",
            "tenant": tenant,
            "template": False,
            "content": f"From: app@example.org\r\nSubject: {tenant}\r\n\r\nhello\r\n",
            "recipients": [{"email": f"{tenant}-customer@example.net"}],
        },
        node.local_token,
    )
    assert (status, answer["accepted"]) == (200, 1), answer
    spool_id: str = answer["recipients"][0]["id"]
    wait_until(lambda: spool_id in {r["id"] for r in node.records("TransientFailure")}, 30)
    return spool_id


def _refused_routing(answer: tuple[int, Any], domain: str) -> None:
    status, refused = answer
    assert (status, refused.get("field")) == (403, "$.routing_domain"), refused
    assert refused["error"].startswith(
        f"token 'acme-admin' is bound to tenant acme: routing_domain {domain!r} is not one the operator allows it "
    ), refused
    assert "[[http.token]] routing_domains" in refused["error"], refused


@pytest.mark.parametrize("workers", [1, 2])
def test_a_token_bound_to_a_tenant_cannot_route_its_mail_through_another_tenants_smart_host_account(
    tmp_path: Path, sinks: tuple[ScriptedSink, ScriptedSink], workers: int
) -> None:
    ordinary, relay = sinks
    config = _config(tmp_path, ordinary, relay)
    with PigeonProcess(tmp_path / "node", http={"token": TOKENS}, node={"workers": workers}, **config) as node:
        acme = _inject(node, "acme")
        for selector in ({"tenant": "acme"}, {"domain": "*"}, {"queue": "acme@example.net"}):
            for domain in ("globex-relay.test", "GLOBEX-relay.test.", "example.net", "other.test"):
                rebind = {**selector, "routing_domain": domain}
                _refused_routing(node.http_call("POST", "/api/v1/admin/rebind", rebind, ACME), domain)
            # With a queue of its own tenant too: the routing domain is refused all the same.
            rebind = {**selector, "to_queue": "x:acme@example.net", "routing_domain": "globex-relay.test"}
            _refused_routing(node.http_call("POST", "/api/v1/admin/rebind", rebind, ACME), "globex-relay.test")
        assert relay.after(1.5) == []
        assert node.records("Rebind") == []
        status, message = node.http_call("GET", f"/api/v1/messages/{acme}", token=OPS)
        assert (status, message["routing_domain"], message["attempts"]) == (200, None, 1), message

        # The domain the operator listed for it: acme's own relay account.
        own = {"domain": "*", "routing_domain": "acme-relay.test"}
        status, rebound = node.http_call("POST", "/api/v1/admin/rebind", own, ACME)
        assert (status, rebound["rebound"]) == (200, 1), rebound
        (received,) = relay.wait_for(1)
        assert (received.auth_user, received.recipients) == ("acme", ["acme-customer@example.net"])
        # "": routed by its recipients' own domains again, always taken.
        status, rebound = node.http_call("POST", "/api/v1/admin/rebind", {"domain": "*", "routing_domain": ""}, ACME)
        assert status == 200, rebound

        # The operator's token routes any tenant's mail anywhere, as before.
        globex = _inject(node, "globex")
        rebind = {"tenant": "globex", "routing_domain": "globex-relay.test"}
        status, rebound = node.http_call("POST", "/api/v1/admin/rebind", rebind, OPS)
        assert (status, rebound["rebound"]) == (200, 1), rebound
        wait_until(lambda: len(relay.received) == 2, 30)
        theirs = relay.received[1]
        assert (theirs.auth_user, theirs.recipients) == ("globex", ["globex-customer@example.net"])
        # (the sink has the data before the node has its 250 and writes the record)
        wait_until(lambda: {r["id"] for r in node.records("Delivery")} == {acme, globex}, 30)


def test_a_token_bound_to_a_tenant_gets_the_routing_refusal_through_the_pigeon_command(
    tmp_path: Path, sinks: tuple[ScriptedSink, ScriptedSink]
) -> None:
    ordinary, relay = sinks
    with PigeonProcess(tmp_path / "node", http={"token": TOKENS}, **_config(tmp_path, ordinary, relay)) as node:
        _inject(node, "acme")
        command = ["rebind", "--domain", "*", "--routing-domain", "globex-relay.test",
                   "-c", str(node.config_path), "--token", ACME]  # fmt: skip
        done = zygote.run(command, text=True, timeout=60, check=False)
        assert done.returncode == 2, done
        assert done.stderr.startswith(
            "pigeon: 403: token 'acme-admin' is bound to tenant acme: routing_domain 'globex-relay.test' "
        ), done.stderr
        assert done.stderr.rstrip().endswith("($.routing_domain)"), done.stderr
        assert relay.after(1.5) == []


@pytest.fixture
def cluster(
    tmp_path: Path, sinks: tuple[ScriptedSink, ScriptedSink], redis_server: RedisServer
) -> Iterator[tuple[PigeonProcess, ...]]:
    ordinary, relay = sinks
    config = _config(tmp_path, ordinary, relay)
    with ExitStack() as stack:
        nodes = []
        for name, workers in (("a", 1), ("b", 2)):
            redis = {"url": redis_server.url, "timeout": "1s"}
            node = PigeonProcess(tmp_path / name, http={"token": TOKENS}, node={"name": name, "workers": workers},
                                 redis=redis, **config)  # fmt: skip
            nodes.append(stack.enter_context(node))
        yield tuple(nodes)


def test_a_token_bound_to_a_tenant_is_refused_another_routing_domain_before_any_node_is_told(
    cluster: tuple[PigeonProcess, PigeonProcess], sinks: tuple[ScriptedSink, ScriptedSink]
) -> None:
    _, relay = sinks
    held = {node.config["node"]["name"]: _inject(node, "acme") for node in cluster}
    for asked in cluster:
        rebind = {"domain": "*", "routing_domain": "globex-relay.test"}
        _refused_routing(asked.http_call("POST", "/api/v1/admin/rebind", rebind, ACME), "globex-relay.test")
    assert relay.after(2) == []
    assert not [record for node in cluster for record in node.records("Rebind")]
    # Its own relay, asked on b: every node's acme mail leaves through acme's account.
    own = {"domain": "*", "routing_domain": "acme-relay.test"}
    status, rebound = cluster[1].http_call("POST", "/api/v1/admin/rebind", own, ACME)
    assert (status, rebound["rebound"]) == (200, 2), rebound
    relay.wait_for(2, 30)
    assert {received.auth_user for received in relay.received} == {"acme"}
    for node in cluster:
        wait_until(lambda node=node: held[node.config["node"]["name"]] in {r["id"] for r in node.records("Delivery")})
