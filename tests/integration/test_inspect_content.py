"""`pigeon inspect ID --content | --headers` (Postfix's `postcat -q`, `postcat -h`), and the
Subject in `pigeon inspect`: a running node, a real SMTP client, the real command."""

from __future__ import annotations

import http.client
import os
import smtplib
import subprocess
from pathlib import Path

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess

ACME = "acme-reader-0123456789abcdef"


def _cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    """The command, its stdout as bytes: what `> msg.eml` gets."""
    return zygote.run([*args], timeout=60)


def _message(size: int, subject: bytes = b"plain") -> bytes:
    # 8-bit bytes that are no UTF-8, and a line with a leading dot (stuffed on the wire): the
    # stored bytes, not a decoding of them, must come back.
    head = b"From: a@example.org\r\nTo: b@example.net\r\nSubject: " + subject + b"\r\nX-Tenant: acme\r\n\r\n"
    line = b"body \xff\xfe\xe9 line\r\n.dot line\r\n"
    return head + line * (size // len(line) + 1)


def _send(pigeon: PigeonProcess, message: bytes) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.sendmail("a@example.org", ["b@example.net"], message, mail_options=["BODY=8BITMIME"])


@pytest.mark.parametrize("workers", [1, 2])
def test_inspect_content_writes_each_stored_message_byte_for_byte_and_headers_its_header_section(
    tmp_path: Path, workers: int
) -> None:
    # In the database (small), in a segment (medium) and in a file of its own (large, past
    # inline_limit: streamed), on whichever worker took it: each comes back as stored.
    spool = {"inline_limit": "64KiB", "segment_from": "16KiB"}
    with PigeonProcess(tmp_path / "node", node={"workers": workers}, spool=spool) as pigeon:
        sent = {size: _message(size, subject=b"size %d" % size) for size in (300, 30_000, 3_000_000)}
        for _ in range(2):  # several connections: with two workers, each takes some
            for message in sent.values():
                _send(pigeon, message)
        stored = pigeon.spool_messages()
        assert len(stored) == 6
        assert list(pigeon.spool_path.glob("shard-*/data/*")) and list(pigeon.spool_path.glob("shard-*/segments/*"))
        config = ["-c", str(pigeon.config_path)]
        for row in stored:
            (size,) = [size for size, message in sent.items() if row["data"].endswith(message)]
            whole = _cli("inspect", *config, row["id"], "--content")
            assert whole.returncode == 0, whole.stderr
            assert whole.stdout == row["data"] and whole.stdout.startswith(b"Received: ")
            head = _cli("inspect", *config, row["id"], "--headers")
            assert head.returncode == 0, head.stderr
            assert head.stdout == row["data"][: row["data"].index(b"\r\n\r\n") + 2]
            assert head.stdout.endswith(b"X-Tenant: acme\r\n")
            shown = _cli("inspect", *config, row["id"])
            assert f"\nsubject        size {size}\n" in shown.stdout.decode(), shown.stdout


def test_inspect_shows_the_subject_decoded_with_terminal_controls_escaped(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node") as pigeon:
        _send(pigeon, _message(10, subject=b"=?utf-8?q?caf=C3=A9_=1B]0;pwned=07?=\r\n folded"))
        (row,) = pigeon.spool_messages()
        shown = _cli("inspect", "-c", str(pigeon.config_path), row["id"])
        assert shown.returncode == 0, shown.stderr
        text = shown.stdout.decode()
        assert "\nsubject        café \\x1b]0;pwned\\x07 folded\n" in text, text
        assert "\x1b" not in text
        lines = [line.split()[0] for line in text.splitlines()]
        assert lines.index("subject") == lines.index("recipients") + 1  # with the envelope


def test_a_token_bound_to_a_tenant_reads_that_tenants_messages_alone(tmp_path: Path) -> None:
    tokens = [{"name": "acme", "token": ACME, "scopes": ["read"], "tenants": ["acme"]}]
    with PigeonProcess(tmp_path / "node", http={"token": tokens}) as pigeon:
        _send(pigeon, _message(10))
        _send(pigeon, _message(10).replace(b"X-Tenant: acme", b"X-Tenant: globex"))
        rows = {row["envelope"].tenant: row for row in pigeon.spool_messages()}
        config = ["-c", str(pigeon.config_path), "--token", ACME]
        own = _cli("inspect", *config, rows["acme"]["id"], "--content")
        assert (own.returncode, own.stdout) == (0, rows["acme"]["data"])
        for part in ("--content", "--headers"):
            other = _cli("inspect", *config, rows["globex"]["id"], part)
            assert (other.returncode, other.stdout) == (2, b"")
            # As inspect says of it: as of an id nothing has.
            assert f"404: no message {rows['globex']['id']} here (id)" in other.stderr.decode()
        assert (
            f"404: no message {rows['globex']['id']} here"
            in _cli("inspect", *config, rows["globex"]["id"]).stderr.decode()
        )


@pytest.mark.parametrize("workers", [1, 2])
def test_the_content_endpoint_answers_message_rfc822_with_its_length_and_a_head_without_a_body(
    tmp_path: Path, workers: int
) -> None:
    with PigeonProcess(tmp_path / "node", node={"workers": workers}, spool={"inline_limit": "64KiB"}) as pigeon:
        _send(pigeon, _message(200_000))
        (row,) = pigeon.spool_messages()
        auth = {"Authorization": f"Bearer {pigeon.local_token}"}
        connection = http.client.HTTPConnection("127.0.0.1", pigeon.http_port, timeout=30)
        for method in ("HEAD", "GET", "HEAD", "GET"):  # one connection: a HEAD's answer ends where it should
            for part in ("content", "headers"):
                connection.request(method, f"/api/v1/messages/{row['id']}/{part}", headers=auth)
                response = connection.getresponse()
                body = response.read()
                assert response.status == 200, body
                if part == "content":
                    assert response.headers["Content-Type"] == "message/rfc822"
                    assert int(response.headers["Content-Length"]) == len(row["data"])
                expected = row["data"] if part == "content" else row["data"].partition(b"\r\n\r\n")[0] + b"\r\n"
                assert body == (b"" if method == "HEAD" else expected)
        connection.close()
        missing = _cli("inspect", "-c", str(pigeon.config_path), "0" * 16, "--content")
        assert missing.returncode == 2 and b"404: no message 0000000000000000 here" in missing.stderr


def test_inspect_content_takes_no_json(tmp_path: Path) -> None:
    refused = _cli("inspect", "-c", os.devnull, "0" * 16, "--content", "--json")
    assert refused.returncode == 2 and b"--json goes with neither" in refused.stderr
