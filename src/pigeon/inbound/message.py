"""One message on its way to an application, and the identity it carries there.

The dedupe key is the SHA-256 of the raw bytes: the same stored message always gives the same
key (a re-fetch after a crash, a retry after a 500), whereas a Message-ID can be missing or
forged. It travels with every job, webhook and row so the application can enforce uniqueness
even when arbitration could not (a Redis failover, a node paused past its lease).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Final

from pigeon.inbound.headers import decoded, header_fields

_HEADER_END: Final = re.compile(rb"\r?\n\r?\n")
_CONTROL: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_MESSAGE_ID: Final = re.compile(rb"(?im)^message-id:[ \t]*((?:.*)(?:\r?\n[ \t].*)*)")


def dedupe_key(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def header_block(raw: bytes) -> bytes:
    match = _HEADER_END.search(raw)
    return raw[: match.start()] if match else raw


def message_id(raw: bytes) -> str | None:
    """The Message-ID header's value, unfolded, or None."""
    match = _MESSAGE_ID.search(header_block(raw))
    if match is None:
        return None
    value = re.sub(rb"\r?\n[ \t]+", b" ", match.group(1))
    # Control characters (a stray CR, a NUL) would make the id unusable in an HTTP header
    # or a PostgreSQL text column, and so make the message impossible to hand over.
    value = _CONTROL.sub(b"", value).strip()
    return value.decode("utf-8", "replace") or None


def _header_safe(address: str) -> bytes:
    """An envelope address as header text (UTF-8: SMTPUTF8 mail), with nothing that could end
    the field or start another (the address came in over SMTP and was parsed, but cheaply sure)."""
    return _CONTROL.sub(b"", address.encode("utf-8", "replace"))


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """A message and where it came from."""

    raw: bytes
    source: str  # "imap:<mailbox>" or "smtp"
    received_at: float
    mailbox: str | None = None  # "user@host:port/folder"
    uidvalidity: int | None = None
    uid: int | None = None
    spool_id: str | None = None
    sender: str | None = None
    recipients: tuple[str, ...] = ()
    dedupe_key: str = field(default="")
    message_id: str | None = None

    @classmethod
    def of(cls, raw: bytes, source: str, received_at: float, **where: Any) -> InboundMessage:
        return cls(raw, source, received_at, dedupe_key=dedupe_key(raw), message_id=message_id(raw), **where)

    def envelope_header(self) -> bytes:
        """Mail received over SMTP: its envelope as header fields to put on top of it where
        nothing else carries it (a Maildir file), as local delivery agents do: `Return-Path`
        and one `X-Original-To` per recipient, in the message's own line endings. A message
        with several recipients is handed over once, so this is how an application learns
        which of its addresses it was sent to (a Bcc names none of them in the header).
        Empty for mail fetched from a mailbox, whose envelope Pigeon never saw."""
        if self.spool_id is None or self.sender is None:
            return b""
        first = self.raw.find(b"\n")
        end = b"\n" if first >= 0 and self.raw[first - 1 : first] != b"\r" else b"\r\n"
        fields = [b"Return-Path: <" + _header_safe(self.sender) + b">"]
        fields += [b"X-Original-To: " + _header_safe(recipient) for recipient in self.recipients]
        return end.join(fields) + end

    def metadata(self, fields: list[list[str]] | None = None) -> dict[str, Any]:
        """What travels with the message to the application, besides the raw bytes: among
        it `subject`, `from` and `to` from the header, decoded to text (None when missing).
        `fields`: the header's fields, where the caller has them already."""
        if fields is None:
            fields = header_fields(header_block(self.raw))
        meta: dict[str, Any] = {
            "dedupe_key": self.dedupe_key,
            "message_id": self.message_id,
            "source": self.source,
            "received_at": self.received_at,
            "size": len(self.raw),
            **decoded(fields),
        }
        if self.mailbox is not None:
            meta.update(mailbox=self.mailbox, uidvalidity=self.uidvalidity, uid=self.uid)
        if self.spool_id is not None:
            meta.update(id=self.spool_id, sender=self.sender, recipients=list(self.recipients))
        return meta
