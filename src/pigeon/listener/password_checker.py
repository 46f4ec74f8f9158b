"""Password checks on their own threads, with a bound on how many may wait.

scrypt takes tens of milliseconds of CPU per check. On the loop's default executor, which
the Maildir and log targets also use, a flood of AUTH would queue ahead of their writes; and
unbounded, it would queue without limit. `PasswordChecker` owns a small thread pool for
checks alone and refuses (`CheckerBusy`) a check beyond `max_waiting` outstanding ones, so
the listener can answer 454 4.7.0 at once instead of piling work up.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from pigeon.listener.passwords import PasswordFile

THREAD_NAME_PREFIX = "pigeon-auth"


class CheckerBusy(Exception):
    """As many checks as allowed are already running or waiting: answer 454 4.7.0."""


class PasswordChecker:
    """Checks passwords against a users file on `threads` threads of its own."""

    def __init__(self, *, threads: int = 2, max_waiting: int = 32) -> None:
        self.max_waiting = max_waiting
        self.outstanding = 0
        """Checks submitted and not yet done (running or queued for a thread)."""
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=THREAD_NAME_PREFIX)

    def check(self, passwords: PasswordFile, username: str, password: str) -> asyncio.Future[bool]:
        """A future of whether `passwords` has this user with this password; raises
        `CheckerBusy` when full. The users file is an argument: SIGHUP may replace it."""
        if self.outstanding >= self.max_waiting:
            raise CheckerBusy(f"{self.outstanding} password checks already waiting")
        future = asyncio.get_running_loop().run_in_executor(self._executor, passwords.check, username, password)
        self.outstanding += 1
        future.add_done_callback(self._done)
        return future

    def _done(self, future: asyncio.Future[bool]) -> None:
        self.outstanding -= 1

    def close(self) -> None:
        """Drop checks not yet started and let the threads end; does not wait for them."""
        self._executor.shutdown(wait=False, cancel_futures=True)
