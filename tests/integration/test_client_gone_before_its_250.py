"""A client that hangs up (its connection reset: a FIN alone is a half-close, answered as ever)
before its 250 can be given: a message still being checked (a slow policy hook) is not stored,
since the client never heard it was taken and will send it again; one already being committed is
kept, and its Reception record says the 250 was not given. Whatever was answered 250 is kept,
whatever was kept is recorded. The same holds for an HTTP injection's client, recipient by
recipient."""

from __future__ import annotations

import json
import socket
import sqlite3
import struct
import textwrap
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import wait_until

README = Path(__file__).resolve().parents[2] / "README.md"
MESSAGE = b"From: <sender@example.org>\r\nSubject: %s\r\n\r\nHello.\r\n"
# The second message's hook in the injection that its client leaves: the client waits until
# the first is stored, then goes while this runs, however slow a loaded machine makes both.
SLOWER = 3.0
SLOW = """
    import asyncio
    async def on_message(message):
        if message.headers["Subject"] == "slow":
            await asyncio.sleep(0.8)
"""


def _send_and_hang_up(port: int, verb: str, subject: bytes, after: float) -> None:
    """A whole transaction, then, `after` seconds past the end of its content, gone without
    waiting for the answer: a reset (RST), as from a client whose host or network failed. (A
    close that sends FIN only says the client sends no more: a half-close, answered all the
    same, see test_half_closed_client_gets_its_replies.py.)"""
    with RawSmtp(port) as client:
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close: RST
        client.expect(220)
        client.expect(250, "EHLO client.test")
        client.expect(250, "MAIL FROM:<sender@example.org>")
        client.expect(250, "RCPT TO:<rcpt@example.net>")
        content = MESSAGE % subject
        if verb == "DATA":
            client.expect(354, "DATA")
            client.send(content + b".\r\n")
        else:
            client.send(b"BDAT %d LAST\r\n" % len(content) + content)
        time.sleep(after)


@pytest.mark.parametrize("verb", ["DATA", "BDAT"])
def test_a_message_whose_client_hangs_up_while_the_policy_checks_it_is_not_stored(tmp_path: Path, verb: str) -> None:
    tmp_path.mkdir(exist_ok=True)
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(SLOW))
    with PigeonProcess(tmp_path / "node", policy={"module": str(module), "timeout": "1s"}) as pigeon:
        _send_and_hang_up(pigeon.smtp_port, verb, b"slow", after=0.2)
        said = pigeon.wait_stderr("client gone before message")
        assert "message not stored (nothing was accepted: it never got a 250)" in said
        (refused,) = [r for r in pigeon.wait_records("Rejection") if r["command"] == verb]
        assert (refused["response"]["code"], refused["response"]["enhanced"]) == (451, "4.4.2")
        assert refused["recipients"] == ["rcpt@example.net"] and refused["sender"] == "sender@example.org"
        assert refused["id"] in said
        # The node goes on, and a client that waits for its answer has its message taken.
        with RawSmtp(pigeon.smtp_port) as client:
            client.expect(220)
            client.expect(250, "EHLO client.test")
            client.expect(250, "MAIL FROM:<sender@example.org>")
            client.expect(250, "RCPT TO:<rcpt@example.net>")
            client.expect(354, "DATA")
            client.send(MESSAGE % b"slow" + b".\r\n")
            client.expect(250)
        (reception,) = pigeon.wait_records("Reception")
        assert [m["id"] for m in pigeon.spool_messages()] == [reception["id"]]
        assert "answered" not in reception  # (said only when the 250 could not be given)


@pytest.mark.parametrize("verb", ["DATA", "BDAT"])
def test_a_message_whose_client_hangs_up_during_the_commit_is_kept_and_its_reception_says_it_was_not_answered(
    tmp_path: Path, verb: str
) -> None:
    with PigeonProcess(tmp_path / "node") as pigeon:
        # The spool's write lock, held by another connection: the commit waits for it (SQLite's
        # busy timeout) as it would for a slow disk, long enough for the client to go.
        with closing(sqlite3.connect(pigeon.spool_path / "shard-0" / "spool.db", isolation_level=None)) as holder:
            holder.execute("BEGIN IMMEDIATE")
            _send_and_hang_up(pigeon.smtp_port, verb, b"committed", after=0.3)
            time.sleep(0.2)  # its reset reaches the node while the commit waits
            holder.execute("ROLLBACK")
        said = pigeon.wait_stderr("client gone during the commit")
        (reception,) = pigeon.wait_records("Reception")
        assert reception["answered"] is False and reception["response"]["code"] == 250
        assert f"message {reception['id']} is stored and kept, but its 250 could not be given" in said
        assert [m["id"] for m in pigeon.spool_messages()] == [reception["id"]]
        assert [r for r in pigeon.records("Rejection") if r["command"] == verb] == []


def _inject_and_hang_up(
    port: int, token: str, subjects: list[str], after: float = 0.0, until: Callable[[], object] | None = None
) -> None:
    """An injection request, one recipient per subject's message (the subject as the
    recipient's substitution), then, `after` seconds on (or once `until` holds), a close
    without reading the answer."""
    request = {
        "envelope_sender": "sender@example.org",
        "recipients": [{"email": f"rcpt{n}@example.net", "substitutions": {"s": s}} for n, s in enumerate(subjects)],
        "content": {"from": {"email": "sender@example.org"}, "subject": "{{ s }}", "text": "Hello.\n"},
    }
    body = json.dumps(request).encode()
    head = (
        f"POST /api/v1/inject HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(head.encode() + body)
        time.sleep(after)
        if until is not None:
            wait_until(until, timeout=20, interval=0.01)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_injection_whose_client_hangs_up_while_the_policy_checks_it_stores_only_what_was_committed_before(
    tmp_path: Path, workers: int
) -> None:
    tmp_path.mkdir(exist_ok=True)
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(SLOW).replace("sleep(0.8)", f"sleep({SLOWER})"))
    policy = {"module": str(module), "timeout": f"{SLOWER + 1:g}s"}
    with PigeonProcess(tmp_path / "node", policy=policy, node={"workers": workers}) as pigeon:
        # The first recipient's message is checked at once and stored; the second's hook is
        # slow, and the client is gone before it ends. With two workers, the client's
        # connection is the supervisor's, which closes the worker's when it goes. (The client
        # goes once the first's commit has ended, its Reception written: 0.3 s after the
        # request was not always enough for that on a loaded machine.)
        _inject_and_hang_up(
            pigeon.http_port, pigeon.local_token, ["fast", "slow"], until=lambda: pigeon.records("Reception")
        )
        said = pigeon.wait_stderr("client gone before message")
        assert "not stored (nothing was accepted: it never got an answer)" in said
        (refused,) = pigeon.wait_records("Rejection")
        assert refused["command"] == "inject" and refused["recipients"] == ["rcpt1@example.net"]
        assert (refused["response"]["code"], refused["response"]["enhanced"]) == (451, "4.4.2")
        assert refused["id"] in said
        (reception,) = pigeon.wait_records("Reception")
        # Stored before the client left, so no `answered: false`, though it never got the answer:
        # the README's event table must not let an operator read `answered` as "the client was told".
        assert reception["recipients"] == ["rcpt0@example.net"] and "answered" not in reception
        assert [m["id"] for m in pigeon.spool_messages()] == [reception["id"]]
        row = next(line for line in README.read_text().splitlines() if line.startswith("| `Reception` |"))
        assert "Over HTTP it never says that the client got the answer" in row
        assert "a recipient committed before the client left has no `answered` either" in row
        # A client that waits for its answer has both taken.
        status, answer = pigeon.http_post(
            "/api/v1/inject",
            {
                "envelope_sender": "sender@example.org",
                "recipients": [{"email": "late@example.net"}],
                "content": {"from": {"email": "sender@example.org"}, "subject": "slow", "text": "Hello.\n"},
            },
            pigeon.local_token,
        )
        assert status == 200 and answer["accepted"] == 1, answer


def test_an_injection_whose_client_hangs_up_during_the_commit_is_kept_and_its_reception_says_it_was_not_answered(
    tmp_path: Path,
) -> None:
    with PigeonProcess(tmp_path / "node") as pigeon:
        with closing(sqlite3.connect(pigeon.spool_path / "shard-0" / "spool.db", isolation_level=None)) as holder:
            holder.execute("BEGIN IMMEDIATE")
            _inject_and_hang_up(pigeon.http_port, pigeon.local_token, ["committed"], after=0.3)
            time.sleep(0.2)  # its close reaches the node while the commit waits
            holder.execute("ROLLBACK")
        said = pigeon.wait_stderr("client gone during the commit")
        (reception,) = pigeon.wait_records("Reception")
        assert reception["answered"] is False and reception["protocol"] == "HTTP"
        assert f"message {reception['id']} is stored and kept, but its answer could not be given" in said
        assert [m["id"] for m in pigeon.spool_messages()] == [reception["id"]]
        assert pigeon.records("Rejection") == []
