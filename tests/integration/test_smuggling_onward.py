"""SMTP smuggling towards the next hop: nothing Pigeon sends on ends DATA early.

The next hop here is `WireSink`, which takes "<LF>.<LF>" and "<LF>.<CR><LF>" as the end of
DATA, like the MTAs that smuggling abuses. A smuggled end of data shows up there as a second
transaction, from a sender nobody authorised. Three depths are tried:

* a value of an injection request that would be written into a header as it is;
* a composed message that would carry a bare LF or CR, or a NUL, into the spool;
* a body with bare line endings already in the spool (written there behind Pigeon's back).
"""

from __future__ import annotations

import smtplib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import WireSink, delivery_config

TOKEN = "inject-token-0123456789"
SMUGGLED = "\r\nMAIL FROM:<ceo@bank.example>\r\nRCPT TO:<victim@example.net>\r\nDATA\r\nSubject: pay now\r\n"
# A header value ending the header, then a bare-LF end of data for a lenient next hop.
PAYLOAD = "x\r\nX-Note: y\n." + SMUGGLED


@pytest.fixture(scope="module")
def sink() -> Iterator[WireSink]:
    with WireSink() as running:
        yield running


@pytest.fixture(scope="module")
def pigeon(tmp_path_factory: pytest.TempPathFactory, sink: WireSink) -> Iterator[PigeonProcess]:
    root = tmp_path_factory.mktemp("onward") / "node"
    config = delivery_config(sink.endpoint)
    with PigeonProcess(root, http={"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}, **config) as node:
        yield node


def _raw(**fields: Any) -> dict[str, Any]:
    return {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": "r@example.net"}],
        "content": "From: a@example.org\nSubject: hello\n\nbody\n",
        **fields,
    }


def _attachment(**fields: Any) -> dict[str, Any]:
    content = {
        "from": {"email": "app@example.org"},
        "text": "see attached",
        "html": '<img src="cid:logo">',
        "attachments": [{"data": "hello", **fields}],
    }
    return _raw(content=content)


def _delivered_alone(pigeon: PigeonProcess, sink: WireSink) -> None:
    """A clean message goes through, and it is the only thing the next hop ever saw."""
    before = len(sink.transactions)
    status, answer = pigeon.http_post("/api/v1/inject", _raw(), TOKEN)
    assert (status, answer["accepted"]) == (200, 1), answer
    sink.wait_for(before + 1)
    assert "ceo@bank.example" not in sink.senders()
    assert b"MAIL FROM:<ceo@bank.example>" not in sink.wire


@pytest.mark.parametrize(
    ("request_body", "field", "character"),
    [
        (_raw(tenant=PAYLOAD), "$.tenant", "CR"),
        (_raw(campaign="spring\n." + SMUGGLED), "$.campaign", "CR"),
        (_raw(tenant="acme\0"), "$.tenant", "NUL"),
        (_attachment(file_name="a.txt\n." + SMUGGLED), "$.content.attachments[0].file_name", "CR"),
        (_attachment(file_name="a.txt\n.\nb"), "$.content.attachments[0].file_name", "LF"),
        (_attachment(content_id="logo\n." + SMUGGLED), "$.content.attachments[0].content_id", "CR"),
        (_attachment(content_id="logo\r"), "$.content.attachments[0].content_id", "CR"),
        (_attachment(content_type="text/plain\0"), "$.content.attachments[0].content_type", "NUL"),
    ],
    ids=["tenant", "campaign", "tenant-nul", "file_name", "file_name-lf", "content_id", "content_id-cr", "type-nul"],
)
def test_a_line_break_or_nul_in_a_header_value_gets_400_naming_the_field_and_nothing_is_smuggled(
    pigeon: PigeonProcess, sink: WireSink, request_body: dict[str, Any], field: str, character: str
) -> None:
    status, answer = pigeon.http_post("/api/v1/inject", request_body, TOKEN)
    assert status == 400, answer
    assert answer["field"] == field
    assert f"must not contain a {character}" in answer["error"]
    _delivered_alone(pigeon, sink)


@pytest.mark.parametrize(
    ("request_body", "field"),
    [
        (_raw(content="From: a@example.org\nSubject: hi\n\nnul \0 here\n"), "$.content"),
        (_raw(content={"from": {"email": "a@example.org", "name": "A\0"}, "text": "x"}), "$.content.from.name"),
        (_raw(content={"from": {"email": "a@example.org"}, "subject": "\0", "text": "x"}), "$.content.subject"),
        (_raw(content={"from": {"email": "a@example.org"}, "text": "a\0b"}), "$.content.text"),
        (_raw(recipients=[{"email": "r@example.net", "name": "R\0"}]), "$.recipients[0].name"),
    ],
    ids=["raw", "from-name", "subject", "text", "recipient-name"],
)
def test_a_nul_in_the_content_gets_400_naming_the_field(
    pigeon: PigeonProcess, sink: WireSink, request_body: dict[str, Any], field: str
) -> None:
    status, answer = pigeon.http_post("/api/v1/inject", request_body, TOKEN)
    assert status == 400, answer
    assert answer["field"] == field
    # With SMTP's reply code, as every other content error carries it (README).
    assert answer["error"] == "554 5.6.0 Message contains a NUL octet (RFC 5322 2.3, RFC 6152 2)"


def test_a_composed_message_meets_the_content_check_of_smtp_reception(pigeon: PigeonProcess, sink: WireSink) -> None:
    # The request is clean; one recipient's substitution is not. Only that recipient is
    # refused, with the reply SMTP reception gives the same content. (A NUL rendered into the
    # header section is the request's fault, refused whole: test_http_inject_header_values.)
    request = _raw(
        content="From: a@example.org\nSubject: {{ subject }}\n\n{{ text }}\n",
        recipients=[
            {"email": "bad@example.net", "substitutions": {"subject": "nul", "text": "a \0 b"}},
            {"email": "long@example.net", "substitutions": {"subject": "x" * 1200, "text": "hello"}},
            {"email": "good@example.net", "substitutions": {"subject": "fine", "text": "hello"}},
        ],
    )
    before = len(sink.transactions)
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert status == 200, answer
    bad, long, good = answer["recipients"]
    assert bad["error"] == "554 5.6.0 Message contains a NUL octet (RFC 5322 2.3, RFC 6152 2)"
    assert long["error"] == "554 5.6.0 Message has a line longer than 998 octets (RFC 5322 2.1.1)"
    assert good["id"] and (answer["accepted"], answer["failed"]) == (1, 2)
    (delivered,) = sink.wait_for(before + 1)[before:]
    assert delivered.recipients == ["good@example.net"]


def test_a_body_with_bare_line_endings_in_the_spool_leaves_with_crlf_and_smuggles_nothing(tmp_path: Path) -> None:
    root = tmp_path / "node"
    body = (
        b"From: a@example.org\r\nSubject: stored\r\n\r\nfirst\n.\r\n"
        b"MAIL FROM:<ceo@bank.example>\r\nRCPT TO:<victim@example.net>\r\n"
        b"DATA\r\nSubject: pay now\r\n\r\nbare CR\r.\rlast\n.\nend"
    )
    with PigeonProcess(root) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.sendmail(
            "a@example.org", ["b@example.net"], b"From: a@example.org\r\nSubject: stored\r\n\r\nplaceholder\r\n"
        )
    # Behind Pigeon's back (an old spool, a bug, a disk editor): bare LF and CR in the body.
    conn = sqlite3.connect(root / "spool" / "shard-0" / "spool.db")
    (body_id, data) = conn.execute("SELECT id, data FROM body").fetchone()
    received = data[: data.index(b"Subject: stored")]
    conn.execute("UPDATE body SET data = ?, size = ? WHERE id = ?", (received + body, len(received + body), body_id))
    conn.commit()
    conn.close()
    with WireSink() as sink, PigeonProcess(root, **delivery_config(sink.endpoint)):
        delivered = sink.wait_for(1)[0]
        wire = bytes(sink.wire)
    assert sink.senders() == ["a@example.org"]
    assert b"\n" not in wire.replace(b"\r\n", b"") and b"\r" not in wire.replace(b"\r\n", b"")
    # Every line kept, each now ending CRLF; the lone dots dot-stuffed as whole lines.
    assert b"\r\nfirst\r\n..\r\nMAIL FROM:<ceo@bank.example>\r\n" in wire
    assert b"\r\nbare CR\r\n..\r\nlast\r\n..\r\nend\r\n.\r\n" in wire
    # What the next hop stored: the spooled lines, each a line of content.
    assert delivered.data.endswith(body.replace(b"\r\n", b"\n").replace(b"\r", b"\n").replace(b"\n", b"\r\n") + b"\r\n")
