"""The SMTP client session: whatever a server sends, cut anywhere, the session gives events
or `ClientProtocolError` and nothing else, writes only commands and message data, and keeps
its TLS policy (no STARTTLS when disabled, no MAIL in the clear when required)."""

from __future__ import annotations

from typing import Final

import atheris

from pigeon.smtp.client import ClientProtocolError, Envelope, Recipient
from pigeon.smtp.client_session import (
    NEED_DATA,
    ClientSession,
    Closed,
    Deliver,
    Phase,
    Quit,
    Ready,
    StartTls,
    TlsPolicy,
    TransactionDone,
    Unusable,
)

ENVELOPE: Final = Envelope("a@example.org", [Recipient("b@example.net"), Recipient("c@example.net")], b"x\r\n")
COMMAND_VERBS: Final = (b"EHLO ", b"HELO ", b"STARTTLS", b"MAIL ", b"RCPT ", b"DATA", b"BDAT ", b"RSET", b"QUIT")
REPLIES: Final = [
    b"220 mx.test ESMTP\r\n",
    b"250-mx.test\r\n250-PIPELINING\r\n250-CHUNKING\r\n250-8BITMIME\r\n250 STARTTLS\r\n",
    b"250-mx.test\r\n250 SIZE 10\r\n",
    b"250 2.1.0 ok\r\n",
    b"354 go\r\n",
    b"220 2.0.0 go ahead\r\n",
    b"421 4.4.2 bye\r\n",
    b"550 5.1.1 unknown\r\n",
    b"221 2.0.0 bye\r\n",
]


def check(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    policy = fdp.PickValueInList(list(TlsPolicy))
    session = ClientSession("client.test", tls=policy)
    written: list[bytes] = []
    mail_in_the_clear = False
    tls_up = policy is TlsPolicy.IMPLICIT  # (the I/O layer's handshake came before the banner)
    for _ in range(40):
        if fdp.remaining_bytes() == 0:
            piece = b""  # EOF
        elif fdp.ConsumeBool():
            piece = fdp.PickValueInList(REPLIES)[: fdp.ConsumeIntInRange(1, 200)]
        else:
            piece = fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 64))
        session.receive_data(piece)
        final = None
        try:
            while True:
                event = session.next_event()
                if event is NEED_DATA:
                    break
                if isinstance(event, Closed | Unusable):
                    final = event
                    break
                if isinstance(event, StartTls):
                    assert policy is not TlsPolicy.DISABLED, "STARTTLS although TLS is disabled"
                    if fdp.ConsumeBool():
                        session.tls_established()
                        tls_up = True
                    else:
                        session.tls_failed("handshake failure")
                elif isinstance(event, Ready | TransactionDone):
                    if isinstance(event, Ready) and policy is TlsPolicy.REQUIRED:
                        assert tls_up, "ready in the clear although TLS is required"
                    if session.phase is Phase.CLOSED:  # a 421 ended the transaction: Closed comes next
                        continue
                    out = session.send(Deliver(ENVELOPE) if fdp.ConsumeBool() else Quit())
                    if b"MAIL FROM:" in out and not tls_up:
                        mail_in_the_clear = True
                    written.append(out)
                else:
                    raise AssertionError(f"not an event: {event!r}")
        except ClientProtocolError:
            assert session.data_to_send() == b""
            break
        out = session.data_to_send()
        if out:
            written.append(out)
            mail_in_the_clear = mail_in_the_clear or (b"MAIL FROM:" in out and not tls_up)
        if final is not None or piece == b"":
            break
    assert not (policy is TlsPolicy.REQUIRED and mail_in_the_clear), "MAIL in the clear although TLS is required"
    for out in written:
        assert _commands_and_message_data(out), out


def _commands_and_message_data(out: bytes) -> bool:
    """`out` is command lines and message data (ending in its dot, or the size a BDAT gave), in
    any order: a 421 that follows a 354 in one read puts QUIT right behind the body the 354
    released."""
    while out:
        if out.startswith(COMMAND_VERBS):
            end = out.find(b"\r\n")
            if end < 0:
                return False
            line, out = out[:end], out[end + 2 :]
            if line.startswith(b"BDAT "):
                size = line.split()[1]
                if not size.isdigit() or len(out) < int(size):
                    return False
                out = out[int(size) :]
        elif out.startswith(b".\r\n"):
            out = out[3:]
        else:
            end = out.find(b"\r\n.\r\n")
            if end < 0:
                return False
            out = out[end + 5 :]
    return True
