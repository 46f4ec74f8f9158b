"""The spool's contract: what is durable when, and the typed failures callers answer with.

A call that returns (or a future that resolves) without raising means the change is on disk
and fsynced. Failures are typed so the SMTP listener and the HTTP API can pick the right
reply without matching strings: each carries the `Reply` a client should get.
"""

from __future__ import annotations

from dataclasses import dataclass

from pigeon.message import Envelope, SpoolId
from pigeon.smtp import replies
from pigeon.smtp.replies import Reply


class SpoolError(Exception):
    """The spool could not do what was asked. Nothing was half-written."""

    reply: Reply = replies.SPOOL_ERROR


class SpoolWriteError(SpoolError):
    """A write or fsync failed (I/O error, read-only file system)."""


class SpoolFull(SpoolError):
    """The disk, or the configured spool size limit, is full."""


class SpoolClosed(SpoolError):
    """The spool is shutting down and takes no more writes."""

    reply = replies.r(421, "4.3.2", "Service shutting down, message not stored, try again later")


class SpoolBusy(SpoolError):
    """Another process holds this spool shard."""


class SpoolCorrupt(SpoolError):
    """The spool database itself cannot be read: start-up stops rather than guess."""


@dataclass(frozen=True, slots=True)
class NewMessage:
    """One message of a reception, ready to be stored. `id` comes from `Spool.new_ids()`."""

    id: SpoolId
    queue: str
    envelope: Envelope
    created: float
    due: float


@dataclass(frozen=True, slots=True)
class Quarantined:
    """A spool entry that could not be read at start-up and was set aside."""

    id: SpoolId
    reason: str


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What opening the spool found."""

    messages: int
    quarantined: tuple[Quarantined, ...]
    orphan_bodies_removed: int
    orphan_files_removed: int
