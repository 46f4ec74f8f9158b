"""A message refused only once it is complete (its last octet a bare CR, its last line without
CRLF over 998 octets) gets its 554 and a Rejection record, and the connection goes on: the
next transaction on it is accepted.

An outside tester's `BDAT 41 LAST` ending in CR got no reply at all: the session emitted the
last chunk's content after the refusal had ended the transaction, the listener had no
transaction to build a message from (AssertionError in _new_draft) and asyncio closed the
connection ("Fatal error on transport").
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import wait_until

TESTER_MESSAGE = b"From: a@example.com\r\nSubject: cr\r\n\r\nbody\r"  # 41 octets, the last a bare CR
GOOD = b"From: a@example.com\r\nSubject: next\r\n\r\nfine\r\n"


def bdat(data: bytes, *, last: bool = False) -> bytes:
    return b"BDAT %d%s\r\n" % (len(data), b" LAST" if last else b"") + data


@pytest.fixture(scope="module")
def pigeon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    with PigeonProcess(tmp_path_factory.mktemp("refused-at-end") / "node") as node:
        yield node


# What is sent after RCPT (chunks answered 250 on the way, the last reply the refusal).
CASES = {
    "BDAT LAST ending in a bare CR": [bdat(TESTER_MESSAGE, last=True)],
    "a chunk ending in CR, then BDAT n LAST": [bdat(b"Subject: x\r\n\r\none\r"), bdat(b"two\r\n", last=True)],
    "a chunk, then BDAT n LAST ending in CR": [bdat(b"Subject: x\r\n\r\n"), bdat(b"two\r", last=True)],
    "BDAT LAST whose last line is 999 octets without CRLF": [bdat(b"Subject: x\r\n\r\n" + b"x" * 999, last=True)],
    "DATA with a CR ending its last line before the dot": [b"DATA\r\n", b"Subject: x\r\n\r\nbody\r\r\n.\r\n"],
}


@pytest.mark.parametrize("pipelined", [False, True], ids=["step by step", "pipelined"])
@pytest.mark.parametrize("after_rset", [False, True], ids=["fresh", "after RSET"])
@pytest.mark.parametrize("what", list(CASES))
def test_refused_at_the_end_of_the_message_then_the_next_transaction_is_accepted(
    pigeon: PigeonProcess, what: str, after_rset: bool, pipelined: bool
) -> None:
    tag = "-".join([str(list(CASES).index(what)), "rset" if after_rset else "fresh", "pipe" if pipelined else "step"])
    sender, recipient = f"s-{tag}@example.org", f"r-{tag}@[127.0.0.1]"
    opening = f"MAIL FROM:<{sender}>\r\nRCPT TO:<{recipient}>\r\n".encode()
    sends = CASES[what]
    verb = "DATA" if sends[0] == b"DATA\r\n" else "BDAT"
    seen = len(pigeon.stderr())  # (one node for all the cases: look at what this one did)
    with RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.expect(250, "EHLO client.test")
        if after_rset:
            # A CHUNKING transaction abandoned first: the refused one starts after RSET.
            client.send(b"MAIL FROM:<abandoned@example.org>\r\nRCPT TO:<x@[127.0.0.1]>\r\n" + bdat(b"abandoned\r\n"))
            for _ in range(3):
                client.expect(250)
            client.expect(250, "RSET")
        if pipelined:
            # The refused transaction and the next one in one write (RFC 2920).
            client.send(opening + b"".join(sends) + opening + bdat(GOOD, last=True))
            replies = [client.reply() for _ in range(2 + len(sends) + 3)]
        else:
            client.send(opening)
            replies = [client.reply(), client.reply()]
            for data in sends:
                client.send(data)
                replies.append(client.reply())
            client.send(opening + bdat(GOOD, last=True))
            replies += [client.reply() for _ in range(3)]
        codes = [code for code, _ in replies]
        # MAIL, RCPT, the chunks (or 354) before the last, the refusal; then MAIL, RCPT, queued.
        assert codes == [250, 250, *([354 if verb == "DATA" else 250] * (len(sends) - 1)), 554, 250, 250, 250], replies
        refusal = replies[1 + len(sends)][1][0]
        assert refusal.startswith("5.6.0 Message "), refusal
        assert "queued as" in replies[-1][1][0]
        client.expect(221, "QUIT")
    (record,) = wait_until(lambda: [r for r in pigeon.records("Rejection") if r.get("sender") == sender])
    assert (record["command"], record["response"]["code"]) == (verb, 554)
    assert record["response"]["enhanced"] == "5.6.0"
    said = pigeon.stderr()[seen:]
    assert "Fatal error" not in said and "Traceback" not in said, said
