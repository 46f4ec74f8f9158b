"""What follows an accepted handoff: its record made durable, then its acknowledgement at the
source, committed in groups.

`GroupCommit.add(items)` returns once a commit that included `items` has ended. While one
commit runs, whatever is added meanwhile gathers into the next group, which is committed as
soon as the first ends. So an item waits at most about two commits, an idle source pays one
commit per item, and a busy one makes fewer, bigger groups rather than a queue of small ones:
the spool's group commit, applied to inbound handoffs (one fsync of the records and one IMAP
command per group). `Commits` is that for the handoffs of one batch, with what a lost IMAP
session means for them.

Sharp edge: a commit that raises fails every `add` waiting on its group, with that error;
the next group is committed all the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from pigeon.inbound.arbitration import Claim
from pigeon.inbound.imap import ImapError, ImapSession
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Handoff

T = TypeVar("T")


class GroupCommit(Generic[T]):
    def __init__(self, commit: Callable[[list[T]], Awaitable[None]]) -> None:
        self._commit = commit
        self._gathering: list[T] = []
        self._next: asyncio.Future[None] | None = None  # ends with the group now gathering
        self._running: asyncio.Task[None] | None = None

    async def add(self, items: Sequence[T]) -> None:
        """Commit `items` with whatever else comes in meanwhile; return once that is done."""
        if not items:
            return
        self._gathering.extend(items)
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        done = self._next
        if self._running is None:
            self._running = asyncio.create_task(self._run())
        # Shielded: a waiter that is cancelled does not cancel the commit its group shares.
        await asyncio.shield(done)

    async def _run(self) -> None:
        try:
            while self._gathering:
                group, self._gathering = self._gathering, []
                done, self._next = self._next, None
                assert done is not None
                try:
                    await self._commit(group)
                except asyncio.CancelledError:
                    done.cancel()
                    raise
                except Exception as error:
                    done.set_exception(error)
                    done.exception()  # retrieved: a group nobody waits on any more is not an error
                else:
                    done.set_result(None)
        finally:
            self._running = None
            if self._gathering and self._next is not None:  # cancelled: nobody will commit these
                self._next.cancel()
                self._gathering, self._next = [], None


@dataclass(slots=True)
class Accepted:
    """A handoff the target accepted (or, ORPHANED, one a dead node made), to be committed."""

    claim: Claim
    message: InboundMessage
    answer: Handoff
    duration: float | None = None


class Commits:
    """The accepted handoffs of one batch, committed in groups by `commit` (the watcher's:
    records fsynced, then the messages acknowledged).

    An acknowledgement the server refuses does not stop the batch: its messages are recorded
    and marked done, and a later round acknowledges them. A lost session or a command that
    timed out does: no new handoff starts (`usable`), and `check()` raises the error once
    the batch is over, so the watcher reconnects.
    """

    def __init__(self, session: ImapSession, commit: Callable[[list[Accepted]], Awaitable[None]]) -> None:
        self.session = session
        self._commit = commit
        self._group: GroupCommit[Accepted] = GroupCommit(self._guarded)
        self.refused: list[tuple[list[int], ImapError]] = []
        self.error: Exception | None = None

    @property
    def usable(self) -> bool:
        return self.error is None and not self.session.lost

    async def add(self, items: Sequence[Accepted]) -> None:
        await self._group.add(items)

    async def _guarded(self, group: list[Accepted]) -> None:
        try:
            await self._commit(group)
        except ImapError as error:
            if self.session.lost:
                self.error = error
            else:
                self.refused.append(([a.claim.uid for a in group], error))
        except (TimeoutError, OSError) as error:
            self.error = error

    def check(self) -> list[tuple[list[int], ImapError]]:
        """Raise what broke the session; return the acknowledgements the server refused."""
        if self.error is not None:
            raise self.error
        return self.refused
