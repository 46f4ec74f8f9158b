"""The node's signals (SIGHUP: reload; SIGTERM, SIGINT: stop), held while a process cannot act on them.

Their default actions end a process (SIGHUP, SIGTERM) or raise KeyboardInterrupt wherever it is
(SIGINT). A `pigeon serve` process spends its first seconds importing and reading its config,
before its event loop has handlers for them: a reload script that signals a node just started
would kill it. So `pigeon serve` blocks the three as its very first act (`hold`), and the loop
lets them in once its handlers are in place (`release`): a signal sent meanwhile was pending,
not lost, and is acted on then (a stop stops, a reload is applied once the node has started).
Once the node has stopped they are held again: the process is only exiting.

Sharp edge: nothing covers the interpreter's own start, before any of Pigeon's code runs (tens
of milliseconds). The supervisor does not signal a worker before it is ready (`Supervisor.reload`).
"""

from __future__ import annotations

import signal
from typing import Final

NODE_SIGNALS: Final = frozenset({signal.SIGHUP, signal.SIGINT, signal.SIGTERM})


def hold() -> None:
    """Block the node's signals in this thread, and in the threads and processes it starts
    from now on (they inherit the mask): they stay pending until `release`."""
    signal.pthread_sigmask(signal.SIG_BLOCK, NODE_SIGNALS)


def release() -> bool:
    """Unblock them, once the loop handles them: those pending are delivered now. True if they
    were held (a `pigeon serve` process); a node run by a test in its own process was not."""
    before = signal.pthread_sigmask(signal.SIG_UNBLOCK, NODE_SIGNALS)
    return signal.SIGHUP in before
