"""What changes in a message on its way out: Pigeon's own routing headers come off, and
its DKIM signatures go on top.

The tenant and campaign headers (`X-Tenant`, `X-Campaign` by default) name the queue a
message was put in; they are for Pigeon, not for the recipient. The signatures were made at
reception (`pigeon.intake`) over the message as it leaves here: no signature covers the
headers taken off, so taking them off keeps the signatures valid.
"""

from __future__ import annotations

from pigeon.message import Message
from pigeon.spool.shards import Spools


def strip_headers(message: bytes, names: tuple[bytes, ...]) -> bytes:
    """`message` without the header fields called `names` (lower-case, no colon).

    Only the header section is looked at; folded continuation lines of a removed field go
    with it. Returns the same object when there is nothing to remove (the usual case).
    """
    if message.startswith(b"\r\n"):
        return message  # no header section at all
    end = message.find(b"\r\n\r\n")
    head = message if end < 0 else message[: end + 2]
    lowered = head.lower()
    if not any((b"\n" + name + b":") in lowered or lowered.startswith(name + b":") for name in names):
        return message
    kept: list[bytes] = []
    dropping = False
    for line in head.split(b"\r\n"):
        if line[:1] in (b" ", b"\t"):
            if not dropping:
                kept.append(line)
            continue
        field = line.split(b":", 1)[0].strip().lower()
        dropping = field in names
        if not dropping:
            kept.append(line)
    rest = b"" if end < 0 else message[end + 2 :]
    return b"\r\n".join(kept) + rest


class OutgoingBody:
    """A message's bytes as they leave: as stored (`Spools.body`), Pigeon's headers off."""

    def __init__(self, spools: Spools, strip: tuple[bytes, ...]) -> None:
        self._spools = spools
        self._strip = strip  # lower-case header names

    def __call__(self, message: Message) -> bytes:
        """Raises `SpoolError` if the stored body cannot be read."""
        body = self._spools.body(message)
        envelope = message.envelope
        if envelope.tenant is not None or envelope.campaign is not None:
            body = strip_headers(body, self._strip)
        if envelope.dkim_signatures is not None:
            body = envelope.dkim_signatures + body
        return body
