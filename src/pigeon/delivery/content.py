"""What changes in a message on its way out: Pigeon's own routing headers come off, the
policy's header edits are made, and its DKIM signatures go on top.

The tenant and campaign headers (`X-Tenant`, `X-Campaign` by default) name the queue a
message was put in; they are for Pigeon, not for the recipient.

The policy's `on_message` hook may add and remove headers. The body was streamed into the
spool as it arrived, so the edits are kept in the envelope (`headers_added`,
`headers_removed`) and made here, on the bytes that leave. `edited()` is the message the
signatures cover: the intake signs it at reception (`pigeon.intake`), and `render()`, what
is delivered, is the signatures on top of it (and, for a message that is all header, the
empty line after it).
"""

from __future__ import annotations

import re
from typing import Final

from pigeon.message import Envelope, Message
from pigeon.spool.shards import Spools

ROUTING_HEADERS: Final = (b"x-tenant", b"x-campaign")
"""The default `[delivery] tenant_header` and `campaign_header`, lower-case."""


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
    # A loose look first (a field may have blanks before its colon): the lines are only
    # split when a name is there at all.
    if not any(name in lowered for name in names):
        return message
    kept: list[bytes] = []
    dropping = dropped = False
    for line in head.split(b"\r\n"):
        if line[:1] in (b" ", b"\t"):
            if not dropping:
                kept.append(line)
            continue
        field = line.split(b":", 1)[0].strip().lower()
        dropping = field in names
        if dropping:
            dropped = True
        else:
            kept.append(line)
    if not dropped:
        return message
    rest = b"" if end < 0 else message[end + 2 :]
    return b"\r\n".join(kept) + rest


# The trace fields a message starts with, each with its continuation lines.
_TRACE: Final = re.compile(rb"(?:(?i:received|return-path)[ \t]*:[^\r\n]*\r\n(?:[ \t][^\r\n]*\r\n)*)*")
# Pigeon's own Received field, the first of every message it took in (`pigeon.intake`).
_OWN_RECEIVED: Final = re.compile(rb"(?i:received)[ \t]*:[^\r\n]*\r\n(?:[ \t][^\r\n]*\r\n)*")


def edited(stored: bytes, envelope: Envelope, routing: tuple[bytes, ...] = ROUTING_HEADERS) -> bytes:
    """`stored` (the spooled bytes) with the routing headers (`routing`: lower-case names) and
    the policy's removed headers taken off (but for Pigeon's own Received field), and the
    added headers (the policy's, a submission's Date and Message-ID) in the order given, on
    top but below the trace fields the message starts with (Received, Return-Path: RFC 5322
    3.6.7 keeps them in a block at the top): what the DKIM signatures are made over.

    Returns `stored` itself when nothing changes (the usual case: no copy).
    """
    # The intake sets tenant or campaign when it found their header, or lists a routing
    # header it found without a value under headers_removed: else none is there, and the
    # header section is not even looked at. Whoever added one, a client or the policy, it
    # never leaves.
    names = routing if envelope.tenant is not None or envelope.campaign is not None else ()
    removed = envelope.headers_removed
    if removed:
        names = names + tuple(name.encode("utf-8") for name in removed)
    if b"received" in names and (own := _OWN_RECEIVED.match(stored)) is not None:
        # A policy's remove_headers=["Received"] takes the earlier hops' off, not Pigeon's
        # own: the next hop's loop detection and hop count (RFC 5321 6.3) rely on it.
        message = stored[: own.end()] + strip_headers(stored[own.end() :], names)
    else:
        message = strip_headers(stored, names) if names else stored
    added = envelope.headers_added
    if added:
        on_top = "".join(
            field + "\r\n" for field in added if field.split(":", 1)[0].strip().lower().encode() not in routing
        )
        at = _TRACE.match(message).end()  # type: ignore[union-attr]  # (matches the empty string)
        message = message[:at] + on_top.encode("utf-8") + message[at:]
    return message


def render(stored: bytes, envelope: Envelope, routing: tuple[bytes, ...] = ROUTING_HEADERS) -> bytes:
    """The message as it will be delivered: `edited()`, its DKIM signatures on top, and the
    empty line that ends its header section when it has none (`ended_header`)."""
    message = ended_header(edited(stored, envelope, routing))
    signatures = envelope.dkim_signatures
    return message if signatures is None else signatures + message


def ended_header(message: bytes) -> bytes:
    """`message`, with an empty line after its last field if it is all header (RFC 5322
    lets the empty line go when there is no body): an equivalent message, the one every
    verifier reads alike (OpenDKIM failed `simple` header signatures of such mail, which
    dkimpy passed). Its DKIM signatures hold: the body is empty either way.
    Returns `message` itself when it has the empty line (the usual case: no copy)."""
    if not message or message.startswith(b"\r\n") or b"\r\n\r\n" in message:
        return message
    return message + (b"\r\n" if message.endswith(b"\r\n") else b"\r\n\r\n")


class OutgoingBody:
    """A message's bytes as they leave: as stored (`Spools.body`), then `render`ed."""

    def __init__(self, spools: Spools, strip: tuple[bytes, ...]) -> None:
        self._spools = spools
        self._strip = strip  # lower-case header names

    def __call__(self, message: Message) -> bytes:
        """Raises `SpoolError` if the stored body cannot be read."""
        return render(self._spools.body(message), message.envelope, self._strip)
