"""No message has the campaign `inbound`, at any door: its queue `inbound:tenant@domain` would
read as an [[inbound]] route's (`inbound:<target>`), and `pigeon retry --queue 'inbound:*'` or
`pigeon bounce --queue 'inbound:*'` would take it with those. A queue named outright that way
is refused already (`queue_name`); one made of the campaign was not: an injection with
`"campaign": "inbound", "tenant": "hook"` to u@hold.example was queued as
`inbound:hook@hold.example`. README: "Tenant and campaign names"."""

from __future__ import annotations

import smtplib
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import wait_until

TOKEN = "campaign-token-0123456789"
REFUSED = "is {value!r}: its queues (inbound:...) would be taken for the [[inbound]] routes' own, which are named so"
POLICY = """
    from pigeon.policy import Changes

    def on_message(message):
        if message.headers["Subject"] == "policy":
            return Changes(campaign="inbound")
        return None
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    root = tmp_path_factory.mktemp("campaign-inbound")
    module = root / "policy.py"
    module.write_text(textwrap.dedent(POLICY))
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject", "admin", "read"]}]}
    with PigeonProcess(root / "node", http=http, policy={"module": str(module)}) as pigeon:
        yield pigeon


def _request(subject: str = "hi", headers: str = "", **more: Any) -> dict[str, Any]:
    return {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": "u@hold.example"}],
        "content": f"From: app@example.org\r\nSubject: {subject}\r\n{headers}\r\nhello\r\n",
        "template": False,
        **more,
    }


def _inbound_queued(node: PigeonProcess) -> list[str]:
    return [m["queue"] for m in node.spool_messages() if m["queue"].lower().startswith("inbound:")]


@pytest.mark.parametrize("value", ["inbound", "INBOUND", "Inbound"])
def test_an_injection_s_campaign_inbound_is_refused_naming_the_field(node: PigeonProcess, value: str) -> None:
    status, answer = node.http_post("/api/v1/inject", _request(campaign=value, tenant="hook"), TOKEN)
    assert status == 400, answer
    assert answer == {"error": f"campaign {REFUSED.format(value=value)} (it names a queue)", "field": "$.campaign"}
    assert _inbound_queued(node) == []


def test_a_tenant_inbound_names_no_inbound_queue_and_is_taken(node: PigeonProcess) -> None:
    status, answer = node.http_post("/api/v1/inject", _request(subject="tenant", tenant="inbound"), TOKEN)
    assert status == 200, answer
    assert _inbound_queued(node) == []


def test_a_campaign_header_inbound_is_refused_over_http_and_smtp(node: PigeonProcess) -> None:
    refusal = f"554 5.6.0 X-Campaign header {REFUSED.format(value='inbound')} (it names a queue)"
    status, answer = node.http_post("/api/v1/inject", _request(headers="X-Campaign: inbound\r\n"), TOKEN)
    assert status == 400, answer
    assert answer == {"error": refusal, "field": "$.content"}
    with smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
        client.ehlo("client.test")
        client.mail("sender@example.org")
        client.rcpt("u@hold.example")
        code, text = client.data(b"From: sender@example.org\r\nX-Campaign: inbound\r\nSubject: smtp\r\n\r\nhi\r\n")
    assert f"{code} {text.decode()}" == refusal
    assert _inbound_queued(node) == []


def test_a_policy_s_campaign_inbound_is_the_hook_s_failure(node: PigeonProcess) -> None:
    status, answer = node.http_post("/api/v1/inject", _request(subject="policy"), TOKEN)
    assert status == 503, answer
    assert answer["recipients"][0]["error"].startswith("451 4.3.0"), answer
    failures = wait_until(lambda: node.records("PolicyFailure"))
    assert REFUSED.format(value="inbound") in failures[-1]["error"], failures
    assert _inbound_queued(node) == []
