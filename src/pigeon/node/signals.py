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

Sharp edge: nothing covers the interpreter's own start, before any of Pigeon's code runs (tens
of milliseconds). The supervisor does not signal a worker before it is ready (`Supervisor.reload`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Final

NODE_SIGNALS: Final = frozenset({signal.SIGHUP, signal.SIGINT, signal.SIGTERM})
STOPS: Final = frozenset({signal.SIGINT, signal.SIGTERM})


class Stopped(BaseException):
    """SIGTERM or SIGINT came during a `stoppable` block. A BaseException, as KeyboardInterrupt
    is: the policy module's import turns every Exception into a load error (exit 2)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def hold() -> None:
    """Block the node's signals in this thread, and in the threads and processes it starts
    from now on (they inherit the mask): they stay pending until `release`."""
    signal.pthread_sigmask(signal.SIG_BLOCK, NODE_SIGNALS)


def release() -> bool:
    """Unblock them, once the loop handles them: those pending are delivered now. True if they
    were held (a `pigeon serve` process); a node run by a test in its own process was not."""
    before = signal.pthread_sigmask(signal.SIG_UNBLOCK, NODE_SIGNALS)
    return signal.SIGHUP in before


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
