"""A message refused for its framing (a bare LF, a line over 998 octets, over max_message_size),
by DATA or BDAT, leaves nothing in the spool: its `Rejection` record must say whose mail it was,
sender and recipients, as a refusal of its header does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import wait_until

MAX_SIZE = 4096


@pytest.fixture(scope="module")
def pigeon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    with PigeonProcess(tmp_path_factory.mktemp("framing") / "node", smtp={"max_message_size": MAX_SIZE}) as node:
        yield node


CONTENT = {
    "bare LF": b"Subject: x\r\n\r\none\ntwo\r\n",
    "line over 998": b"Subject: x\r\n\r\n" + b"a" * 999 + b"\r\n",
    "over max_message_size": b"Subject: x\r\n\r\n" + (b"a" * 70 + b"\r\n") * (MAX_SIZE // 72 + 10),
}


def _transaction(client: RawSmtp, sender: str, recipients: list[str]) -> None:
    client.expect(220)
    client.expect(250, "EHLO client.test")
    client.expect(250, f"MAIL FROM:<{sender}>")
    for recipient in recipients:
        client.expect(250, f"RCPT TO:<{recipient}>")


@pytest.mark.parametrize("verb", ["DATA", "BDAT"])
@pytest.mark.parametrize("what", list(CONTENT))
def test_a_message_refused_for_its_framing_is_logged_with_its_sender_and_recipients(
    pigeon: PigeonProcess, verb: str, what: str
) -> None:
    tag = f"{verb.lower()}-{what.replace(' ', '-')}"  # (one node for all: whose record is whose)
    sender, recipients = f"{tag}@example.org", [f"ann-{tag}@example.net", f"bob-{tag}@example.com"]
    content = CONTENT[what]
    with RawSmtp(pigeon.smtp_port) as client:
        _transaction(client, sender, recipients)
        if verb == "DATA":
            client.expect(354, "DATA")
            client.send(content + b".\r\n")
        else:
            client.send(f"BDAT {len(content)} LAST\r\n".encode() + content)
        code, _ = client.reply()
        assert code in (552, 554)
        client.expect(221, "QUIT")
    (refused,) = wait_until(lambda: [r for r in pigeon.records("Rejection") if r.get("recipients") == recipients])
    assert (refused["command"], refused["response"]["code"]) == (verb, code)
    assert refused.get("sender") == sender
