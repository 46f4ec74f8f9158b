"""Mail that is not UTF-8 goes in by HTTP as SMTP takes it: raw content as the base64 of its
bytes (`"content_encoding": "base64"`), sent as it is, with the checks and replies raw text
gets. `pigeon inject` sends a message file (or stdin) that is not UTF-8 that way
(it exited 2 with only "'utf-8' codec can't decode byte 0xe9"), and drops a first line
`From sender date` (mbox's envelope line, which an MTA pipes), as sendmail and Postfix do: it
made all the message body, its From and Subject included (README, "Injection")."""

from __future__ import annotations

import base64
import email
import email.policy
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp

TOKEN = "bytes-token-0123456789abcdef"
MAX_SIZE = 8192
LATIN1 = b"From: a@example.org\nSubject: caf\xe9\nContent-Type: text/plain; charset=iso-8859-1\n\nh\xe9llo\n"
"""The outside tester's, with an 8-bit header too: LF line endings, as a file on disk has."""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    """Delivery off: what is taken stays in the spool, to be read."""
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    root = tmp_path_factory.mktemp("bytes") / "node"
    with PigeonProcess(root, http=http, smtp={"max_message_size": MAX_SIZE}) as node:
        yield node


def _inject(node: PigeonProcess, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    command = ["inject", "-c", str(node.config_path), "--token", TOKEN]
    command += ["--from", "app@example.org", *args]
    return zygote.run(command, input=stdin, timeout=60, check=False)


def _stored(node: PigeonProcess, recipient: str) -> dict[str, Any]:
    (message,) = [m for m in node.spool_messages() if m["recipients"] == [recipient]]
    return message


def _crlf(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r\n")


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_pigeon_inject_no_template_sends_latin1_bytes_as_they_are(
    node: PigeonProcess, tmp_path: Path, source: str
) -> None:
    path = tmp_path / "l1.eml"
    path.write_bytes(LATIN1)
    recipient = f"{source}@example.net"
    if source == "file":
        done = _inject(node, "--to", recipient, "--no-template", str(path))
    else:
        done = _inject(node, "--to", recipient, "--no-template", "-", stdin=LATIN1)
    assert done.returncode == 0, done
    stored = _stored(node, recipient)
    assert stored["data"].endswith(_crlf(LATIN1))  # after Pigeon's Date and Message-ID
    assert b"\r\nDate: " in stored["data"].partition(b"\r\n\r\n")[0]
    # 8-bit, and no UTF-8: 8BITMIME, no SMTPUTF8 (as SMTP takes it from a client asking for none).
    assert (stored["envelope"].body, stored["envelope"].smtputf8) == ("8BITMIME", False)


def test_pigeon_inject_of_latin1_as_a_template_exits_2_saying_what_to_do(node: PigeonProcess) -> None:
    before = len(node.spool_messages())
    done = _inject(node, "--to", "template@example.net", "--template", "-", stdin=LATIN1)
    assert done.returncode == 2, done
    assert done.stderr.decode() == (
        "pigeon inject: the message is not UTF-8 (byte 0xe9 at offset 32), so it cannot be a template: send it as"
        " it is, without --template\n"
    )
    assert len(node.spool_messages()) == before


def test_pigeon_inject_utf8_stays_a_template(node: PigeonProcess) -> None:
    message = "From: a@example.org\nSubject: caf\u00e9 {{ code }}\n\nh\u00e9llo\n".encode()
    done = _inject(node, "--to", "utf8@example.net", "--template", "--var", "code=7", "-", stdin=message)
    assert done.returncode == 0, done
    stored = _stored(node, "utf8@example.net")
    assert stored["data"].endswith(_crlf(message.replace(b"{{ code }}", b"7")))
    assert stored["envelope"].smtputf8 is True  # UTF-8 in the header


@pytest.mark.parametrize("template", [False, True])
def test_pigeon_inject_drops_an_mbox_envelope_line(node: PigeonProcess, template: bool) -> None:
    recipient = f"mbox-{template}@example.net".lower()
    message = b"From: a@example.org\nSubject: hi\n\nhello\nFrom the start\n"
    envelope_line = b"From sender@example.org Sat Dec  5 10:00:00 2025\n"
    done = _inject(node, "--to", recipient, *(["--template"] if template else []), "-", stdin=envelope_line + message)
    assert done.returncode == 0, done
    data = _stored(node, recipient)["data"]
    assert b"sender@example.org" not in data
    # Its From and Subject are the header's, not the body's: no empty line before them.
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"\r\nFrom: a@example.org\r\nSubject: hi" in head
    assert body == b"hello\r\nFrom the start\r\n"


def test_pigeon_inject_keeps_a_first_from_field_in_the_obsolete_syntax(node: PigeonProcess) -> None:
    message = b"From : a@example.org\nSubject: hi\n\nhello\n"
    done = _inject(node, "--to", "obsolete@example.net", "--no-template", "-", stdin=message)
    assert done.returncode == 0, done
    assert _stored(node, "obsolete@example.net")["data"].endswith(_crlf(message))


def _request(data: bytes, recipient: str, **more: Any) -> dict[str, Any]:
    return {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": recipient}],
        "content": base64.b64encode(data).decode(),
        "content_encoding": "base64",
        "template": False,
        **more,
    }


def test_api_takes_base64_bytes_and_asks_smtputf8_for_a_utf8_header_only(node: PigeonProcess) -> None:
    utf8 = "From: a@example.org\r\nSubject: caf\u00e9\r\n\r\nh\u00e9llo\r\n".encode()
    ascii_head = b"From: a@example.org\r\nSubject: hi\r\n\r\nh\xe9llo\r\n"
    for content, recipient, body, smtputf8 in [
        (utf8, "api-utf8@example.net", "8BITMIME", True),
        (ascii_head, "api-latin1@example.net", "8BITMIME", False),
        (b"From: a@example.org\r\nSubject: hi\r\n\r\nhello\r\n", "api-ascii@example.net", None, False),
    ]:
        status, answer = node.http_post("/api/v1/inject", _request(content, recipient), TOKEN)
        assert (status, answer["accepted"]) == (200, 1), answer
        stored = _stored(node, recipient)
        assert stored["data"].endswith(content)
        assert (stored["envelope"].body, stored["envelope"].smtputf8) == (body, smtputf8)


CHECKED = {
    "long line": b"From: a@example.org\r\nSubject: " + b"s" * 1000 + b"\r\n\r\nh\xe9llo\r\n",
    "two from": b"From: a@example.org\r\nFrom: b@example.org\r\n\r\nh\xe9llo\r\n",
    "too big": b"From: a@example.org\r\nSubject: hi\r\n\r\n" + (b"\xe9" * 70 + b"\r\n") * (MAX_SIZE // 72 + 10),
    "bare cr": b"From: a@example.org\r\nSubject: hi\r\n\r\nh\xe9llo\rthere\r\n",
    "nul": b"From: a@example.org\r\nSubject: hi\r\n\r\nh\xe9l\0lo\r\n",
}


@pytest.mark.parametrize("case", list(CHECKED))
def test_api_base64_content_meets_the_checks_raw_text_does_with_the_same_replies(
    node: PigeonProcess, case: str
) -> None:
    content = CHECKED[case]
    recipient = f"checked-{case.replace(' ', '-')}@example.net"
    before = len(node.spool_messages())
    text = {**_request(content, recipient), "content": content.decode("latin-1")}
    del text["content_encoding"]
    replies = [node.http_post("/api/v1/inject", request, TOKEN) for request in (_request(content, recipient), text)]
    if case == "bare cr":  # made CRLF, as raw text's line breaks are
        assert [(status, answer["accepted"]) for status, answer in replies] == [(200, 1), (200, 1)], replies
        stored = [m["data"] for m in node.spool_messages() if m["recipients"] == [recipient]]
        assert [data.endswith(b"h\xe9llo\r\nthere\r\n") for data in stored] == [True, False]  # (text: UTF-8)
        return
    (status, answer), (text_status, text_answer) = replies
    assert status == 400
    assert answer["field"] == "$.content"
    # "too big" in text is larger (each \xe9 two octets in UTF-8): the same reply all the same.
    assert (status, answer) == (text_status, text_answer)
    assert len(node.spool_messages()) == before


def test_smtp_refuses_the_same_bytes_with_the_same_reply(node: PigeonProcess) -> None:
    status, answer = node.http_post("/api/v1/inject", _request(CHECKED["long line"], "smtp@example.net"), TOKEN)
    with RawSmtp(node.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<app@example.org> BODY=8BITMIME")
        smtp.expect(250, "RCPT TO:<smtp@example.net>")
        smtp.expect(354, "DATA")
        code, lines = smtp.command(CHECKED["long line"] + b".")
    assert (status, answer["error"]) == (400, f"{code} {lines[-1]}")


@pytest.mark.parametrize(
    ("more", "field", "error"),
    [
        ({"template": True}, "$.template", "content in base64 is bytes, sent as they are, not a Jinja2 template"),
        ({"content": "not base64!"}, "$.content", "not base64: "),
        ({"content": {"from": {"email": "a@example.org"}, "text": "hi"}}, "$.content_encoding", "only raw content"),
        ({"content_encoding": "gzip"}, "$.content_encoding", ""),
    ],
)
def test_api_base64_content_refusals_name_the_field(
    node: PigeonProcess, more: dict[str, Any], field: str, error: str
) -> None:
    status, answer = node.http_post(
        "/api/v1/inject", _request(b"Subject: hi\r\n\r\nhi\r\n", "x@example.net", **more), TOKEN
    )
    assert status == 400, answer
    assert answer["field"] == field
    assert answer["error"].startswith(error)


WRAPPED = b"From: a@example.org\r\nSubject: hi\r\n\r\n" + b"h\xe9llo there " * 20 + b"\r\n"
WRAPS = {
    "base64(1)": lambda text: base64.encodebytes(text).decode(),  # 76 columns, LF, one at the end
    "mime": lambda text: base64.encodebytes(text).decode().replace("\n", "\r\n"),  # RFC 2045 6.8: CRLF
    "white space": lambda text: " \t" + " ".join(base64.b64encode(text).decode()) + "\r\n\n",
}


@pytest.mark.parametrize("wrap", list(WRAPS))
def test_api_takes_base64_broken_into_lines_as_base64_1_and_mime_write_it(node: PigeonProcess, wrap: str) -> None:
    """Found from outside: base64 wrapped at 76 columns, or ending in a line break, got 400
    "not base64: Only base64 data is allowed" ("Excess data after padding"), as `content` and
    as an attachment's `data`, at both doors: what base64(1) and MIME writers put out (RFC 2045
    6.8: decoders ignore the line breaks)."""
    encoded = WRAPS[wrap](WRAPPED)
    recipient = f"wrapped-{wrap.replace(' ', '-').replace('(1)', '')}@example.net"
    request = {**_request(WRAPPED, recipient), "content": encoded}
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer["accepted"]) == (200, 1), answer
    assert _stored(node, recipient)["data"].endswith(WRAPPED)
    attachment = {"data": encoded, "base64": True, "content_type": "application/octet-stream", "file_name": "m.bin"}
    content = {"from": {"email": "a@example.org"}, "text_body": "hi", "attachments": [attachment]}
    kumo = {"envelope_sender": "app@example.org", "recipients": [{"email": f"kumo-{recipient}"}], "content": content}
    status, answer = node.http_post("/api/inject/v1", kumo, TOKEN)
    assert (status, answer["success_count"]) == (200, 1), answer
    message = email.message_from_bytes(_stored(node, f"kumo-{recipient}")["data"], policy=email.policy.default)
    [part] = [part for part in message.walk() if part.get_filename() == "m.bin"]
    assert part.get_content() == WRAPPED


@pytest.mark.parametrize("other", ["*", "\u00a0", "\u2028", "-"])
def test_api_refuses_base64_with_any_other_character_naming_the_field(node: PigeonProcess, other: str) -> None:
    """White space aside (ASCII), a character outside base64's alphabet is still refused."""
    encoded = base64.encodebytes(WRAPPED).decode()
    encoded = encoded[:40] + other + encoded[40:]
    status, answer = node.http_post("/api/v1/inject", {**_request(WRAPPED, "x@example.net"), "content": encoded}, TOKEN)
    assert (status, answer["field"]) == (400, "$.content"), answer
    assert answer["error"].startswith("not base64: "), answer
    attachment = {"data": encoded, "base64": True}
    content = {"from": {"email": "a@example.org"}, "text": "hi", "attachments": [attachment]}
    request = {"envelope_sender": "app@example.org", "recipients": [{"email": "x@example.net"}], "content": content}
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer["field"]) == (400, "$.content.attachments[0].data"), answer
    assert answer["error"].startswith("not base64: "), answer
