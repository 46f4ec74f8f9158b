"""A domain written as a U-label (`bücher.test`) and as its A-label (`xn--bcher-kva.test`) is
one domain: one delivery for the mailbox named both ways, one queue, one suspension, at
every door."""

from __future__ import annotations

import smtplib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pigeon.smtp.address import a_label, same_mailbox_key
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

U_LABEL = "idn@bücher.test"
A_LABEL = "idn@xn--bcher-kva.test"


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink(smtputf8=True) as running:
        yield running


@pytest.fixture
def pigeon(tmp_path: Path, sink: ScriptedSink) -> Iterator[PigeonProcess]:
    with PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as process:
        yield process


def test_a_label_is_the_form_both_spellings_share() -> None:
    assert a_label("Bücher.TEST") == a_label("xn--bcher-kva.test") == "xn--bcher-kva.test"
    assert a_label("*.bücher.test") == "*.xn--bcher-kva.test"
    assert a_label("[192.0.2.1]") == "[192.0.2.1]"
    assert a_label("straße.example") == "xn--strae-oqa.example"  # IDNA 2008: not strasse.example
    assert same_mailbox_key(U_LABEL) == same_mailbox_key(A_LABEL)
    assert same_mailbox_key("Idn@bücher.test") != same_mailbox_key(A_LABEL)  # a local part keeps its case


def test_a_mailbox_named_by_both_forms_of_its_domain_gets_one_copy(pigeon: PigeonProcess, sink: ScriptedSink) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo()
        refused = client.sendmail(
            "s@sender.test",
            [U_LABEL, A_LABEL],
            b"From: a@example.org\r\nSubject: idn\r\n\r\nhello\r\n",
            mail_options=["SMTPUTF8"],
        )
        assert refused == {}
    (received,) = sink.wait_for(1)
    assert len(received.recipients) == 1
    time.sleep(1)  # a second copy would have come by now
    assert len(sink.received) == 1
    assert [r["queue"] for r in pigeon.records("Reception") if r["session"] != "local"] == ["xn--bcher-kva.test"]
    assert pigeon.records("Bounce") == []


def test_a_suspension_of_either_form_holds_mail_to_both(pigeon: PigeonProcess, sink: ScriptedSink) -> None:
    status, answer = pigeon.http_post("/api/v1/admin/suspend", {"domain": "xn--bcher-kva.test"}, pigeon.local_token)
    assert status == 200, answer
    status, again = pigeon.http_post("/api/v1/admin/suspend", {"domain": "Bücher.test"}, pigeon.local_token)
    assert status == 200 and again["rule"]["id"] == answer["rule"]["id"], again  # one rule
    for recipient in (U_LABEL, "other@bücher.test"):
        status, injected = pigeon.http_post(
            "/api/v1/inject",
            {
                "envelope_sender": "s@sender.test",
                "content": "From: a@example.org\r\nSubject: x\r\n\r\nhi\r\n",
                "recipients": [{"email": recipient}],
            },
            pigeon.local_token,
        )
        assert status == 200, injected
    wait_until(lambda: len(pigeon.records("Reception")) >= 2, 10)
    time.sleep(1.5)
    assert sink.received == []  # held, both
    status, resumed = pigeon.http_call("DELETE", f"/api/v1/admin/suspend/{answer['rule']['id']}", None,
                                       pigeon.local_token)  # fmt: skip
    assert status == 200, resumed
    status, _ = pigeon.http_post("/api/v1/admin/retry", {"domain": "bücher.test"}, pigeon.local_token)
    sink.wait_for(2, timeout=30)


def test_an_ascii_mailbox_at_a_u_label_domain_goes_as_its_a_label_to_a_server_without_smtputf8(
    tmp_path: Path,
) -> None:
    with (
        ScriptedSink(smtputf8=False) as sink,
        PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon,
    ):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo()
            assert (
                client.sendmail(
                    "s@bücher.test", [U_LABEL], b"From: a@example.org\r\nSubject: idn\r\n\r\nhello\r\n", ["SMTPUTF8"]
                )
                == {}
            )
        (received,) = sink.wait_for(1)
        assert received.recipients == [A_LABEL]
        assert received.sender == "s@xn--bcher-kva.test"
        assert "SMTPUTF8" not in received.mail_options
        assert pigeon.wait_records("Delivery")[0]["recipient"] == U_LABEL  # logged as the client wrote it
        assert pigeon.records("Bounce") == []


def test_config_globs_and_inbound_routes_written_as_u_labels_name_either_spelling() -> None:
    from pigeon.config.patterns import address_glob, domain_glob
    from pigeon.inbound.routes import InboundRoute, InboundRoutes

    assert domain_glob("Bücher.test.") == domain_glob("xn--bcher-kva.test") == "xn--bcher-kva.test"
    assert address_glob("support@bücher.test") == "support@xn--bcher-kva.test"
    routes = InboundRoutes([InboundRoute("app", recipient=address_glob("support@bücher.test"))])
    assert routes.target("support@bücher.test") == routes.target("support@xn--bcher-kva.test") == "app"
