"""An address refused at one door is refused at all of them, with the same text: SMTP
(a real socket), POST /api/v1/inject and `pigeon inject`; and what is accepted meanwhile is
all in the spool. Also what only injection has: repeated recipients, bounded metadata,
tenant and campaign names."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess

TOKEN = "doors-token-0123456789"

LITERAL = "Not a valid address literal: [IPv4] or [IPv6:...] (RFC 5321 4.1.3)"
TOO_LONG = "Address is longer than 254 octets (RFC 5321 4.5.3.1.3)"
LOCAL_TOO_LONG = "Local part is longer than 64 octets (RFC 5321 4.5.3.1.1)"
LABEL_TOO_LONG = "Domain has a label longer than 63 octets (RFC 1035 2.3.4)"
NO_CONTROL = "no control or format characters allowed"
BAD = [
    # (address, SMTP reply code, text)
    ("ceo\u202egro.knab@example.net", 553, f"Address contains U+202E RIGHT-TO-LEFT OVERRIDE: {NO_CONTROL}"),
    ("bob\u2066@example.net", 553, f"Address contains U+2066 LEFT-TO-RIGHT ISOLATE: {NO_CONTROL}"),
    ("bob\u0085@example.net", 553, f"Address contains U+0085: {NO_CONTROL}"),
    ("bob@exa\u200bmple.net", 553, f"Address contains U+200B ZERO WIDTH SPACE: {NO_CONTROL}"),
    ("bob@[IPv6:fe80::1%eth0]", 501, LITERAL),
    ("bob@[300.1.2.3]", 501, LITERAL),
    ("bob@" + ".".join(["ü" * 30] * 4) + ".example", 501, TOO_LONG),  # 134 characters, 255 octets
    ("é" * 33 + "@example.net", 501, LOCAL_TOO_LONG),  # 33 characters, 66 octets
    ("bob@" + "a" * 64 + ".example.net", 501, LABEL_TOO_LONG),  # no DNS name has such a label
    ("bob@" + "ü" * 60 + ".example", 501, LABEL_TOO_LONG),  # its A-label would be over 63 octets
]  # fmt: skip


@pytest.fixture(scope="module")
def pigeon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    tokens = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]
    http = {"token": tokens, "max_metadata_size": 200}
    with PigeonProcess(tmp_path_factory.mktemp("doors") / "node", http=http) as node:
        yield node


def _smtp(pigeon: PigeonProcess, *lines: str) -> list[str]:
    """Each line's reply (one line each), over a real socket; QUIT at the end."""
    replies: list[str] = []
    with socket.create_connection(("127.0.0.1", pigeon.smtp_port), timeout=10) as sock:
        stream = sock.makefile("rb")
        stream.readline()  # greeting
        for line in ("EHLO client.test", *lines, "QUIT"):
            sock.sendall(line.encode() + b"\r\n")
            reply = stream.readline()
            while reply[3:4] == b"-":
                reply = stream.readline()
            replies.append(reply.decode().rstrip("\r\n"))
    return replies[1:-1]


def _inject(pigeon: PigeonProcess, *recipients: str, **extra: Any) -> tuple[int, Any]:
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": r} for r in recipients],
        "content": "From: a@example.org\nSubject: x\n\nhi\n",
        **extra,
    }
    return pigeon.http_post("/api/v1/inject", request, TOKEN)


def _cli(pigeon: PigeonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    command = ["inject", "-c", str(pigeon.config_path), "--token", TOKEN, *args]
    return zygote.run(command, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("bad", "code", "text"), BAD, ids=[f"{c}-{t[:24]}" for _, c, t in BAD])
def test_a_bad_address_is_refused_alike_over_smtp_http_and_the_cli_and_the_good_mail_is_kept(
    pigeon: PigeonProcess, bad: str, code: int, text: str
) -> None:
    before = {m["id"] for m in pigeon.spool_messages()}
    replies = _smtp(
        pigeon,
        "MAIL FROM:<app@example.org> SMTPUTF8",
        f"RCPT TO:<{bad}>",
        "RSET",
        f"MAIL FROM:<{bad}> SMTPUTF8",
        "MAIL FROM:<app@example.org>",
        "RCPT TO:<smtp@example.net>",
        "DATA",
        "From: a@example.org\r\nSubject: x\r\n\r\nhi\r\n.",
    )
    assert replies[1] == f"{code} 5.1.3 {text}"
    assert replies[3] == f"{code} 5.1.7 {text}"
    assert replies[-1].startswith("250 "), replies

    status, answer = _inject(pigeon, bad)
    assert (status, answer) == (400, {"error": text, "field": "$.recipients[0].email"})
    status, answer = _inject(pigeon, "http@example.net", envelope_sender=bad)
    assert (status, answer) == (400, {"error": text, "field": "$.envelope_sender"})

    refused = _cli(pigeon, "--from", "app@example.org", "--to", "cli@example.net", "--to", bad, "--text", "hi")
    assert refused.returncode == 2
    assert f"400: {text} ($.recipients[1].email)" in refused.stderr

    # What was refused left nothing behind; what was taken meanwhile is in the spool.
    status, answer = _inject(pigeon, "http@example.net")
    assert status == 200 and answer["accepted"] == 1
    accepted = _cli(pigeon, "--from", "app@example.org", "--to", "cli@example.net", "--text", "hi")
    assert accepted.returncode == 0, accepted.stderr
    new = [m for m in pigeon.spool_messages() if m["id"] not in before]
    kept = sorted(r for m in new for r in m["recipients"])
    assert kept == ["cli@example.net", "http@example.net", "smtp@example.net"]


def test_a_repeated_recipient_is_refused_pointing_to_the_first_and_sent_once(pigeon: PigeonProcess) -> None:
    before = {m["id"] for m in pigeon.spool_messages()}
    status, answer = _inject(pigeon, "ann@example.net", "bob@example.net", "ann@EXAMPLE.net", "Ann@example.net")
    assert status == 200, answer
    assert answer["accepted"] == 3 and answer["failed"] == 1
    repeat = answer["recipients"][2]
    assert repeat == {
        "email": "ann@EXAMPLE.net",
        "error": "550 5.1.0 duplicate of recipient 0 of the request",
        "duplicate_of": 0,
    }
    # The local part is the receiving host's to compare (RFC 5321 2.4): Ann is not ann.
    assert "duplicate_of" not in answer["recipients"][3] and answer["recipients"][3]["id"]
    new = [m for m in pigeon.spool_messages() if m["id"] not in before]
    assert sorted(r for m in new for r in m["recipients"]) == ["Ann@example.net", "ann@example.net", "bob@example.net"]
    refusal = pigeon.wait_record("Rejection", lambda r: r.get("recipients") == ["ann@EXAMPLE.net"])
    assert refusal["recipients"] == ["ann@EXAMPLE.net"] and refusal["response"]["code"] == 550

    twice = _cli(pigeon, "--from", "app@example.org", "--to", "cy@example.net", "--to", "cy@example.net", "--text", "x")
    assert twice.returncode == 1
    assert "refused: 550 5.1.0 duplicate of recipient 0 of the request" in twice.stdout


def test_metadata_over_max_metadata_size_and_long_tenant_or_campaign_names_get_400(pigeon: PigeonProcess) -> None:
    before = len(pigeon.spool_messages())
    big = {"note": "x" * 200}  # over the node's 200 bytes once written as JSON
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [
            {"email": "a@example.net", "metadata": {"user": "1"}},
            {"email": "b@example.net", "metadata": big},
        ],
        "content": "From: a@example.org\nSubject: x\n\nhi\n",
    }
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert status == 400
    assert answer == {
        "error": f"metadata is {len(json.dumps(big, separators=(',', ':')))} bytes as JSON,"
        " over [http] max_metadata_size (200)",
        "field": "$.recipients[1].metadata",
    }
    for name in ("tenant", "campaign"):
        status, answer = _inject(pigeon, "a@example.net", **{name: "t" * 256})
        assert status == 400 and answer["field"] == f"$.{name}", answer
        assert "length <= 255" in answer["error"]
    assert len(pigeon.spool_messages()) == before
    status, answer = _inject(pigeon, "a@example.net", tenant="t" * 255, campaign="c" * 255)
    assert status == 200 and answer["accepted"] == 1
