"""What follows an accepted handoff: its record written, then its acknowledgement at the
source, committed in groups.

`GroupCommit.add(items)` returns once a commit that included `items` has ended. While one
commit runs, whatever is added meanwhile gathers into the next group. An idle source commits
an item at once; a busy one at most once per `window` seconds, or as soon as `enough` items
have gathered, so commits are few and groups big without holding an item back for long: the
spool's group commit (and the log writer's flush gap), applied to inbound handoffs. Each
group costs one write of the records and one IMAP command, whatever its size.

`Commits` is that for the handoffs of one batch, with what a lost IMAP session means for them.
`BackgroundSync` fsyncs the log once per batch, without holding the next batch up.

Sharp edge: a commit that raises fails every `add` waiting on its group, with that error;
the next group is committed all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from pigeon.inbound.arbitration import Claim
from pigeon.inbound.imap import ImapError, ImapSession
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Handoff

T = TypeVar("T")


class GroupCommit(Generic[T]):
    def __init__(
        self, commit: Callable[[list[T]], Awaitable[None]], *, window: float = 0.0, enough: int | None = None
    ) -> None:
        self._commit = commit
        self._window = window
        self._enough = enough
        self._gathering: list[T] = []
        self._next: asyncio.Future[None] | None = None  # ends with the group now gathering
        self._running: asyncio.Task[None] | None = None
        self._started = float("-inf")  # loop time the last commit started
        self._full = asyncio.Event()

    async def add(self, items: Sequence[T]) -> None:
        """Commit `items` with whatever else comes in meanwhile; return once that is done."""
        if not items:
            return
        self._gathering.extend(items)
        if self._enough is not None and len(self._gathering) >= self._enough:
            self._full.set()
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        done = self._next
        if self._running is None:
            self._running = asyncio.create_task(self._run())
        # Shielded: a waiter that is cancelled does not cancel the commit its group shares.
        await asyncio.shield(done)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._gathering:
                wait = self._started + self._window - loop.time()
                if wait > 0 and not self._full.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._full.wait(), wait)
                self._full.clear()
                self._started = loop.time()
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
    # Accepted when its claim may not have been ours any more (our heartbeat may have run out):
    # another node may have taken it over, and handed the message over too.
    lapsed: bool = False


class Commits:
    """The accepted handoffs of one batch, committed in groups by `commit` (the watcher's:
    records written, then the messages acknowledged).

    An acknowledgement the server refuses does not stop the batch: its messages are recorded
    and marked done, and a later round acknowledges them. A lost session or a command that
    timed out does: no new handoff starts (`usable`), and `check()` raises the error once
    the batch is over, so the watcher reconnects.
    """

    def __init__(
        self, session: ImapSession, commit: Callable[[list[Accepted]], Awaitable[None]], *, window: float, enough: int
    ) -> None:
        self.session = session
        self._commit = commit
        self._group: GroupCommit[Accepted] = GroupCommit(self._guarded, window=window, enough=enough)
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


class BackgroundSync:
    """Runs `sync` (an fsync of the log) in the background when asked: at once if none is
    under way, else once more after it (one fsync covers every record written before it), so
    however often it is asked, at most one runs and one waits."""

    def __init__(self, sync: Callable[[], Awaitable[None]]) -> None:
        self._sync = sync
        self._running: asyncio.Task[None] | None = None
        self._again = False

    def soon(self) -> None:
        if self._running is not None and not self._running.done():
            self._again = True
            return
        self._running = asyncio.create_task(self._until_current())

    async def wait(self) -> None:
        """Until what was asked for so far is done."""
        if self._running is not None:
            await asyncio.shield(self._running)

    async def _until_current(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            await self._sync()
