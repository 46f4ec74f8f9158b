"""The node's signals (SIGHUP: reload; SIGTERM, SIGINT: stop), held while a process cannot act on them.

Their default actions end a process (SIGHUP, SIGTERM) or raise KeyboardInterrupt wherever it is
(SIGINT). A `pigeon serve` process spends its first seconds importing and reading its config,
before its event loop has handlers for them: a reload script that signals a node just started
would kill it. So `pigeon serve` blocks the three as its very first act (`hold`), and the loop
lets them in once its handlers are in place (`release`): a signal sent meanwhile was pending,
not lost, and is acted on then (a stop stops, a reload is applied once the node has started).
Once the node has stopped they are held again: the process is only exiting.

A stop is the exception: while a process imports the policy module (`stoppable`), which may
take as long as its author's code does, SIGTERM and SIGINT raise `Stopped` there, and the node
stops at once (exit 0, as for any stop during start-up) instead of when the import ends.

And a stop is never put off for ever. Until the node has started (`started`), a thread of the
process watches for them (`_Watch`): it takes those that come while they are held, and leaves
them pending for the main thread as before; it hears of those the loop's handlers or
`stoppable` take. A start-up that has not got to a stop `GRACE` seconds after it (an import
that never returns: a file that stands in for a module, a module that swallows the stop), or
that gets another stop meanwhile (`_AGAIN`), is ended there: the process logs what its start is stuck in
(the main thread's stack) and exits with status 1, without a clean stop.

Sharp edge: nothing covers the interpreter's own start, before any of Pigeon's code runs (tens
of milliseconds). The supervisor does not signal a worker before it is ready (`Supervisor.reload`).
Nor can the watch end a start-up stuck where Python never runs (a C call holding the
interpreter's lock).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from types import FrameType
from typing import Any, Final

NODE_SIGNALS: Final = frozenset({signal.SIGHUP, signal.SIGINT, signal.SIGTERM})
STOPS: Final = frozenset({signal.SIGINT, signal.SIGTERM})
GRACE: Final = 10.0
"""Seconds a stop waits for a start-up to get to it before the process ends where it is."""
_AGAIN: Final = 1.0
"""Seconds after the first a stop must come to be another: a worker gets Ctrl-C's SIGINT and,
a moment later, its supervisor's SIGTERM, which is no one insisting."""
_LOOK: Final = 0.1  # seconds between the watch's looks at the time

_log = logging.getLogger(__name__)


class Stopped(BaseException):
    """SIGTERM or SIGINT came during a `stoppable` block. A BaseException, as KeyboardInterrupt
    is: not for a bare `except Exception` to take. The policy module's import turns whatever the
    module raises into a load error (exit 2), but this, raised by the handler: a stop goes on."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Watch:
    """The stops that come while the process starts, and the bound on how long they wait.

    Its thread takes a stop that comes while the three are blocked in every thread (`hold`)
    with `sigtimedwait`, and sends it on to the main thread, where it stays pending until that
    can act on it (`release`, `stoppable`): as before, but now heard of. A stop the main thread
    takes itself (the loop's handlers, `stoppable`'s) is told to it by `came`. It ends at
    `started` (a stop it takes after that goes to the process again, for the loop)."""

    def __init__(self) -> None:
        self.main = threading.main_thread()
        self.done = False
        self.stops: list[int] = []  # each stop that came, in order
        self.first: float | None = None  # when the first came (monotonic)
        # Stops the watch sent on to the main thread, and those of them `came` was told of
        # since: each counted by one thread only, so neither count can lose a step.
        self._sent_on = 0
        self._told_again = 0
        self._thread = threading.Thread(target=self._run, name="start-up watch", daemon=True)
        self._thread.start()

    def came(self, signum: int) -> None:
        """The main thread took a stop (any thread may call it; signal handlers do)."""
        if self._told_again < self._sent_on:
            self._told_again += 1  # one the watch took and sent on: known already
            return
        self._stop(signum)

    def _run(self) -> None:
        while True:
            taken = signal.sigtimedwait(STOPS, _LOOK)
            if self.done:
                if taken is not None:
                    os.kill(os.getpid(), taken.si_signo)  # the loop's, now that it handles them
                return
            if taken is not None:
                self._stop(taken.si_signo)
                self._sent_on += 1
                signal.pthread_kill(self.main.ident or 0, taken.si_signo)  # pending there, as before
            first = self.first
            if first is not None and (len(self.stops) > 1 or time.monotonic() - first >= GRACE):
                self._give_up()

    def _stop(self, signum: int) -> None:
        now = time.monotonic()
        if self.first is not None and now - self.first < _AGAIN:
            return  # the same stop, said twice
        self.stops.append(signum)
        if self.first is None:
            self.first = now
            _log.info(
                "%s during start-up: the node stops once its start gets to it (if it has not within %.0fs, "
                "or on another stop, it ends where it is)",
                signal.Signals(signum).name,
                GRACE,
            )

    def _give_up(self) -> None:
        """Log where the main thread is, and end the process."""
        name = signal.Signals(self.stops[0]).name
        frame = sys._current_frames().get(self.main.ident or 0)
        # One line, as every record is: the frames, innermost first, those of the import
        # machinery left out (an import stuck shows as the chain of modules importing).
        stack = [f for f in traceback.extract_stack(frame) if not f.filename.startswith("<frozen ")] if frame else []
        places = [f"{f.filename}:{f.lineno} ({f.name})" for f in reversed(stack)] or ["an unknown place"]
        when = f"at another {signal.Signals(self.stops[1]).name}" if len(self.stops) > 1 else f"{GRACE:.0f}s after it"
        _log.error(
            "%s during start-up, which is stuck in %s: the process ends now (status 1, %s), without a clean stop; "
            "its start, innermost first: %s",
            name,
            places[0],
            when,
            " < ".join(places),
        )
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(1)


_watch: _Watch | None = None


def hold(*, watch: bool = False) -> None:
    """Block the node's signals in this thread, and in the threads and processes it starts
    from now on (they inherit the mask): they stay pending until `release`. `watch`: and
    bound how long a stop waits for the start-up (see the module's docstring; `pigeon serve`'s
    first act, in its main thread)."""
    global _watch
    signal.pthread_sigmask(signal.SIG_BLOCK, NODE_SIGNALS)
    if watch and _watch is None and threading.current_thread() is threading.main_thread():
        _watch = _Watch()


def release() -> bool:
    """Unblock them, once the loop handles them: those pending are delivered now. True if they
    were held (a `pigeon serve` process); a node run by a test in its own process was not.
    Until `started`, the stops the loop's handlers take are told to the watch."""
    if _watch is not None and not _watch.done:
        for signum in STOPS:
            _tell_the_watch(signum)
    before = signal.pthread_sigmask(signal.SIG_UNBLOCK, NODE_SIGNALS)
    return signal.SIGHUP in before


def started() -> None:
    """The process has started (or is ending of its own accord): no bound on a stop from now on."""
    if _watch is not None:
        _watch.done = True


def _tell_the_watch(signum: int) -> None:
    """Put a handler before the one the loop gave `signum` that tells the watch first."""
    handler = signal.getsignal(signum)

    def told(number: int, frame: FrameType | None) -> Any:
        watch = _watch
        if watch is not None and not watch.done:
            watch.came(number)
        if callable(handler):
            return handler(number, frame)
        return None

    signal.signal(signum, told)


@contextlib.contextmanager
def stoppable() -> Iterator[None]:
    """A stop (SIGTERM, SIGINT) during the block raises `Stopped` wherever the main thread is,
    a `time.sleep` or a module's import included; one held since the process started comes
    now. SIGHUP stays as it was. Elsewhere than in the main thread, where Python runs signal
    handlers, it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        came.append(signum)  # kept: the block may catch what is raised (a bare except in a module)
        if _watch is not None and not _watch.done:
            _watch.came(signum)  # and if the block swallows it for ever, the watch ends it
        raise Stopped(signum)

    previous = {signum: signal.signal(signum, stop) for signum in STOPS}
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    try:
        yield
        if came:  # swallowed where it was raised: still a stop
            raise Stopped(came[0])
    finally:
        # Blocked before the handlers are put back: one that comes meanwhile stays pending for
        # the handler the process has after the block (the loop's), rather than for none.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
