"""The spool's contract: what is durable when, and the typed failures callers answer with.

A call that returns (or a future that resolves) without raising means the change is on disk
and fsynced. Failures are typed so the SMTP listener and the HTTP API can pick the right
reply without matching strings: each carries the `Reply` a client should get.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar, Protocol

from pigeon.message import Envelope, Message, SpoolId
from pigeon.smtp import replies
from pigeon.smtp.replies import Reply

if TYPE_CHECKING:
    from pigeon.spool.body import Body, BodyWriter


class SpoolError(Exception):
    """The spool could not do what was asked. Nothing was half-written."""

    # (ClassVar: each subclass's own, also where mypyc compiles this module into native classes)
    reply: ClassVar[Reply] = replies.SPOOL_ERROR


class SpoolWriteError(SpoolError):
    """A write or fsync failed (I/O error, read-only file system)."""


class SpoolFull(SpoolError):
    """The disk, or the configured spool size limit, is full."""

    reply: ClassVar[Reply] = replies.SPOOL_FULL


class SpoolClosed(SpoolError):
    """The spool is shutting down and takes no more writes."""

    reply: ClassVar[Reply] = replies.r(421, "4.3.2", "Service shutting down, message not stored, try again later")


class SpoolBusy(SpoolError):
    """Another process holds this spool shard."""


class SpoolCorrupt(SpoolError):
    """The spool database itself cannot be read: start-up stops rather than guess."""


class SpoolDiskFull(SpoolError):
    """The spool cannot be opened because its disk is full. Nothing is wrong with the spool:
    opening it again once there is room works (`Node.start` waits for that)."""


@dataclass(frozen=True, slots=True)
class NewMessage:
    """One message of a reception, ready to be stored. `id` comes from `Spool.new_ids()`."""

    id: SpoolId
    queue: str
    envelope: Envelope
    created: float
    due: float


@dataclass(frozen=True, slots=True)
class Settling:
    """A message's outcome as `Spool.settle` takes it, to commit in the transaction of a
    reception that reports it (its DSN): both are durable, or neither is."""

    message: Message
    remaining: Envelope | None  # the recipients still to do; None: the message is finished
    attempts: int
    due: float
    records: Sequence[tuple[int, bytes]] = ()
    queue: str | None = None


@dataclass(frozen=True, slots=True)
class Quarantined:
    """A spool entry that could not be read and was set aside."""

    id: SpoolId
    reason: str


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What the check after opening the spool found (`SqliteSpool.check`)."""

    messages: int
    quarantined: tuple[Quarantined, ...]
    orphan_bodies_removed: int
    orphan_files_removed: int


class Once:
    """A done callback that runs once, whichever of its calls comes first: the one a committer
    makes as soon as the future is done (`Spool.store`'s `then`), or the loop's, one turn later,
    which still comes when the future was cancelled or failed elsewhere."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[asyncio.Future[Any]], None]) -> None:
        self.callback: Callable[[asyncio.Future[Any]], None] | None = callback

    def __call__(self, future: asyncio.Future[Any]) -> None:
        callback, self.callback = self.callback, None
        if callback is not None:
            callback(future)
        elif not future.cancelled():
            future.exception()  # (told already, maybe through another future: this one's is seen too)


class Spool(Protocol):
    """What every room needs of one spool shard; `pigeon.spool.sqlite.SqliteSpool` is the engine.

    Writes return futures that resolve once the change is durable (group-committed and
    fsynced); reads run on the event loop and see every committed change.
    """

    directory: Path

    @property
    def shard(self) -> int: ...

    @property
    def count(self) -> int:
        """Messages in the spool (committed)."""

    # --- reception -------------------------------------------------------------------------
    def new_ids(self, n: int) -> list[SpoolId]: ...

    def room(self) -> int:
        """Bytes the spool may still grow by (-1 if unknown)."""
        ...

    def body_writer(self, body_id: SpoolId) -> BodyWriter: ...

    def store(
        self,
        body: Body,
        messages: list[NewMessage],
        records: Sequence[tuple[int, bytes]] = (),
        *,
        settles: Settling | None = None,
        then: Callable[[asyncio.Future[None]], None] | None = None,
    ) -> asyncio.Future[None]:
        """Store one reception: its body, its messages and their records, in one transaction,
        with the outcome it `settles` if any (a DSN and the failures it reports: `settles`
        is a message of this shard). `then(future)`: a done callback, called once, from the
        loop callback that completes the commit when it can be (not one loop turn later):
        for a caller whose next step is a client's 250."""

    # --- delivery --------------------------------------------------------------------------
    def due(self, now: float, after: tuple[float, int], limit: int) -> list[Message]:
        """Messages due by `now`, in (due, id) order, strictly after `after`."""

    def get(self, spool_id: int) -> Message | None: ...

    def peek(self, spool_id: int) -> tuple[str, bytes | None] | None:
        """A stored message's queue name and, where that name has no `@` (so no tenant part),
        its envelope as stored, undecoded (None: a name with one); neither the rest of the row
        nor its body is read. None when no row has this id (or its queue name is unreadable).
        Whose mail it is, told at the cost of one indexed read: an absent id costs that read
        too (`Admin.inspect` for a token bound to tenants)."""

    def body(self, body_id: int) -> bytes:
        """A stored body's bytes. Raises SpoolError if it cannot be read."""

    def stored_body(self, body_id: int) -> bytes | BinaryIO:
        """A stored body for an operator to read: its bytes, or its file open to be read in
        pieces (a large one). Raises SpoolError if it cannot be read."""

    def settle(
        self,
        message: Message,
        remaining: Envelope | None,
        *,
        attempts: int,
        due: float,
        records: Sequence[tuple[int, bytes]] = (),
        queue: str | None = None,
    ) -> asyncio.Future[None]:
        """Record an outcome with its terminal records: the row updated, or removed (None)."""

    def rewrite_envelope(self, spool_id: int, envelope: Envelope, *, attempts: int) -> asyncio.Future[None]:
        """Store `envelope` as this message's, if its row is still the one its attempt under way
        was taken from (`attempts` as it was then): an outcome of that attempt that committed
        first is what holds. Nothing else in the row changes."""

    # --- operators -------------------------------------------------------------------------
    def scan(self, after: int, limit: int) -> list[Message]:
        """Messages in id order, strictly after `after`."""

    def make_due(self, rows: Sequence[tuple[int, float]], due: float) -> asyncio.Future[int]:
        """Bring these messages' next attempt forward to `due` (later ones only): each given as
        (id, its due as the caller read it), and changed only if its due is still that. A row
        written since (held by id, settled, deferred again) is left as that write left it: a
        walk's decision on what it read does not undo a hold answered meanwhile. How many
        rows it changed."""

    def queue_counts(self, now: float, held: float) -> list[tuple[str, int, int, int, float, int, int, float | None]]:
        """Per scheduled queue: messages, how many are due, how many held (due at `held` or
        later), the oldest's creation, one of its messages' id, how many are due later (not
        held) and the first of those's due time (any thread)."""

    def rules(self) -> list[tuple[str, bytes]]: ...

    def save_rule(self, rule_id: str, rule: bytes | None) -> asyncio.Future[None]: ...

    # --- the outbox of terminal records --------------------------------------------------------
    def outbox(self, seqs: Sequence[int] | None = None) -> list[tuple[int, bytes]]:
        """Records committed but not yet known durable in the log: all of them, or those `seqs`."""

    def outbox_written(self, seqs: Sequence[int]) -> asyncio.Future[None]:
        """These records are durable in the log: forget them."""

    def outbox_add(self, records: Sequence[tuple[int, bytes]]) -> asyncio.Future[None]:
        """Keep (seq, line) records the log could not take, to be logged later."""
