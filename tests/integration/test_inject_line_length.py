"""A node whose `[smtp] max_line_length` is lowered holds injected mail to it as it holds SMTP
mail, and composes within it: Pigeon never refuses a message it composed itself. Text with a
longer line goes quoted-printable, fields are folded, and what cannot be folded (an address)
is refused before anything is composed, naming the field."""

from __future__ import annotations

import email
from collections.abc import Iterator
from email.message import EmailMessage
from email.policy import default

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp

TOKEN = "line-length-token-0123456789"
LIMIT = 200
LINE = "x" * 250  # the outside tester's: one line of 250 characters


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    """Delivery off: what is taken stays in the spool, to be read."""
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    root = tmp_path_factory.mktemp("line-length") / "node"
    with PigeonProcess(root, http=http, smtp={"max_line_length": LIMIT}) as node:
        yield node


def _stored(node: PigeonProcess, spool_id: str) -> EmailMessage:
    (data,) = [m["data"] for m in node.spool_messages() if m["id"] == spool_id]
    assert max(len(line) for line in data.split(b"\r\n")) <= LIMIT
    message = email.message_from_bytes(data, policy=default)
    assert isinstance(message, EmailMessage)
    return message


@pytest.mark.parametrize("template", [True, False])
def test_parts_with_a_line_over_max_line_length_are_taken_and_read_back(node: PigeonProcess, template: bool) -> None:
    parts = {
        "from": {"email": "app@example.org", "name": "y" * 190},  # a word that keeps a line of its own
        "subject": "s" * 250,
        "headers": {"X-Note": "n" * 250},
        "text": LINE,
        "html": f"<p>{LINE}</p>",
        "attachments": [{"data": "x", "file_name": "f" * 250 + ".txt", "content_type": "text/plain"}],
    }
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": "ann@example.net", "name": "z" * 250}],
        "content": parts,
        "template": template,
        "tenant": "t" * 190,  # (its field folded before it)
    }
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer["accepted"]) == (200, 1), answer
    message = _stored(node, answer["recipients"][0]["id"])
    text, html = message.get_body(("plain",)), message.get_body(("html",))
    assert text is not None and text.get_content().rstrip("\r\n") == LINE
    assert html is not None and html.get_content().rstrip("\r\n") == f"<p>{LINE}</p>"
    assert message["Subject"] == "s" * 250 and message["X-Note"] == "n" * 250
    assert message["From"].addresses[0].display_name == "y" * 190
    assert message["To"].addresses[0].addr_spec == "ann@example.net"
    assert [m["queue"] for m in node.spool_messages() if m["id"] == answer["recipients"][0]["id"]] == [
        "t" * 190 + "@example.net"
    ]


def test_pigeon_inject_of_a_text_with_a_line_over_max_line_length_exits_0(node: PigeonProcess) -> None:
    command = ["inject", "-c", str(node.config_path), "--token", TOKEN]
    command += ["--from", "app@example.org", "--to", "cli@example.net", "--subject", "hi", "--text", LINE]
    done = zygote.run(command, text=True, timeout=60, check=False)
    assert done.returncode == 0, done
    text = _stored(node, done.stdout.split()[-1]).get_body(("plain",))
    assert text is not None and text.get_content().rstrip("\r\n") == LINE


def test_raw_content_with_a_line_over_max_line_length_is_refused_as_smtp_refuses_it(node: PigeonProcess) -> None:
    """Raw content is the client's, as it is: its lines are not Pigeon's to rewrite."""
    refused = f"5.6.0 Message has a line longer than {LIMIT} octets (RFC 5322 2.1.1)"
    with RawSmtp(node.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<app@example.org>")
        smtp.expect(250, "RCPT TO:<ann@example.net>")
        smtp.expect(354, "DATA")
        assert smtp.command(f"Subject: hi\r\n\r\n{LINE}\r\n.") == (554, [refused])
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": "ann@example.net"}],
        "content": f"Subject: hi\n\n{LINE}\n",
        "template": False,
    }
    assert node.http_post("/api/v1/inject", request, TOKEN) == (400, {"error": f"554 {refused}", "field": "$.content"})


def test_an_address_too_long_for_a_line_is_refused_naming_it(node: PigeonProcess) -> None:
    address = "a" * 64 + "@" + "b" * 63 + "." + "c" * 63 + ".example"  # 200 octets: 203 as " <address>"
    before = len(node.spool_messages())
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": "ann@example.net"}, {"email": address}],
        "content": {"from": {"email": "app@example.org"}, "text": "hi"},
    }
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    error = (
        "too long for a header line, where it cannot be folded: 203 octets on its line, over [smtp]"
        f" max_line_length ({LIMIT}), which the message would be refused for"
    )
    assert (status, answer) == (400, {"error": error, "field": "$.recipients[1].email"})
    # A tenant is one word too: its field cannot be folded within it.
    request = {**request, "recipients": [{"email": "ann@example.net"}], "tenant": "t" * 200}
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer) == (400, {"error": error.replace("203", "201"), "field": "$.tenant"})
    assert len(node.spool_messages()) == before
