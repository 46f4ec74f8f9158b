"""The SMTP server session: any bytes, cut anywhere, with any answers from the application,
give well-formed replies and never an exception."""

from __future__ import annotations

import itertools
from typing import Final

import atheris

from pigeon.smtp import replies
from pigeon.smtp.framing import BareLinefeeds
from pigeon.smtp.replies import Reply
from pigeon.smtp.server import ServerConfig
from tests.unit.smtp.harness import REPLY_LINE, drive

# Seeds the fuzzer's first steps: a transaction's commands (it finds the rest itself).
OPENING: Final = b"EHLO client.test\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\n"
ANSWERS: Final = (None, None, None, replies.RELAY_DENIED, replies.SPOOL_ERROR, Reply(421, "4.3.2", ("bye",)))


def check(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    config = ServerConfig(
        hostname="mx.test",
        max_message_size=fdp.PickValueInList([20, 1000, 25 * 1024 * 1024]),
        max_recipients=fdp.PickValueInList([1, 100]),
        max_messages_per_connection=fdp.PickValueInList([1, 100]),
        max_errors=fdp.PickValueInList([0, 3, 20]),
        bare_linefeeds=fdp.PickValueInList(list(BareLinefeeds)),
        chunking=fdp.ConsumeBool(),
        tls_available=fdp.ConsumeBool(),
        auth_mechanisms=fdp.PickValueInList([(), ("PLAIN", "LOGIN")]),
        auth_requires_tls=fdp.ConsumeBool(),
    )
    opening = OPENING if fdp.ConsumeBool() else b""
    answers = [fdp.PickValueInList(list(ANSWERS)) for _ in range(fdp.ConsumeIntInRange(0, 8))]
    cuts = sorted(fdp.ConsumeIntInRange(0, 4096) for _ in range(fdp.ConsumeIntInRange(0, 8)))
    stream = opening + fdp.ConsumeBytes(fdp.remaining_bytes())
    edges = [0, *(c for c in cuts if c < len(stream)), len(stream)]
    pieces = [stream[a:b] for a, b in itertools.pairwise(edges)]
    out = drive(config, pieces, answers, eof=True)
    assert out.startswith(b"220 mx.test ESMTP Pigeon\r\n") and out.endswith(b"\r\n"), out[-200:]
    for line in out.split(b"\r\n")[:-1]:
        assert REPLY_LINE.match(line), line
