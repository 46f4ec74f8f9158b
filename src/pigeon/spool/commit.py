"""Group commit: every change waiting in one transaction, one fsync, then all the answers.

Every spool write is an `Operation` submitted on the event loop; the caller gets a future.
While no commit is in flight, the first submission schedules a batch for the end of the
current loop turn, so everything submitted in that turn joins it. The batch's SQL runs on
the event loop (it is CPU work on cached pages, a few microseconds per row), then the
COMMIT, whose WAL write and fsync (`synchronous=FULL`) block, runs in the commit thread.
Submissions made meanwhile gather for the next batch: the batch size grows with the load
by itself, and one fsync serves them all.

Under load the next batch also lingers (`window`, 2 ms by default) before it starts. An fsync
costs the machine far more than the rows it makes durable (on a VM, the flush is a trip through
the hypervisor), so bigger batches are the cheapest CPU there is: measured relaying 5 KiB over
20 sessions, lingering cut the CPU per message by 16% and raised the rate by 15%.
It lingers only when `LINGER_AFTER` (4) or more operations arrived while the last commit was
in flight, a sign that the worker is busy: a lone message, or moderate traffic, is committed at
once. Measured at half the maximum rate, the median end-of-data-to-250 stayed 0.7 ms with
this threshold; lingering after any 2 made it 3.5 ms, for no CPU gain at full load.

While a commit is in flight, the bodies of the receptions waiting for the next one are
written and made durable beside it, by a second thread (`early`): an operation that says it
has files to write (`early`) has its `prepare` run there, then the committer's `flush`, so
the next batch's COMMIT no longer waits for an fdatasync of its own before its WAL's. Relaying
mail of 20 KiB and more, whose bodies go to segment files, that was 40% of a commit. The
batch claims its operations before it prepares them: one being prepared early is waited
for, one not yet started is prepared by the batch, one whose early work failed is prepared
again (its error, if it sticks, is the batch's). `flush` must make durable everything written
before it was called, even when the other thread's flush is under way (see `Segments.flush`).

Why the split: SQLite releases the GIL around every statement step. A writer thread that
ran the inserts too would need the GIL back after each one, and behind a busy event loop
each hand-over costs up to the interpreter's switch interval (5 ms). Measured here, that
made a commit of 8 messages take 8 ms instead of 0.8 ms. Only COMMIT crosses threads now,
and the connection is only ever used by one thread at a time.

If anything fails, the batch is rolled back and its operations are retried one per
transaction in the commit thread, so one bad operation cannot take its neighbours down.
A disk that is really full fails them all, each with a typed error, unless `no_room` makes room
(an uncapped spool gives back its reserve, `pigeon.spool.reserve`): the write that met the full
disk is then tried again, once. What runs after the
COMMIT (removing freed body files) cannot fail the batch: it is committed, and applying its
operations again would store a reception twice or settle a message that is gone. Such a
failure is logged; a body file left behind is an orphan the next start removes.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from pigeon.spool.spool import Once, SpoolClosed, SpoolError, SpoolFull, SpoolWriteError


class Operation(Protocol):
    """One unit of spool work."""

    def apply(self, conn: sqlite3.Connection) -> Any:
        """Run the SQL (on the event loop). The return value becomes the future's result."""

    def prepare(self) -> None:
        """Write and make durable (fsync) the files the COMMIT refers to (commit thread);
        or only write them, for the committer's `flush` to make durable."""

    def abandon(self) -> None:
        """The operation failed: remove what the caller or `prepare` left behind."""


def _early(op: Operation) -> bool:
    """Whether `op` has files to write and make durable, worth doing before its batch starts."""
    return bool(getattr(op, "early", False))


class Flusher(Protocol):
    """What makes the operations' files durable (`pigeon.spool.segments.Segments`)."""

    def mark(self) -> int:
        """A token to give `flush`, taken before the files it must cover are written."""

    def flush(self, since: int) -> None:
        """Make durable what was written before the call; raise if any flush failed since
        `mark` gave `since`: an fsync error is told once, to one flush, and the pages it
        concerned may be lost, so bodies written before it must be written again."""


BeforeCommit = Callable[[sqlite3.Connection, list[Operation]], Callable[[], None] | None]
"""Runs after the batch's operations, in its transaction, over the whole batch: one statement
for work every operation would otherwise do alone (freeing bodies). Returns what to do once
the commit is durable, if anything."""

NoRoom = Callable[[sqlite3.Connection], bool]
"""Called in the commit thread, outside any transaction, when a write failed for lack of room
on the disk: True if it made room (gave back the spool's reserve), and the write is tried again."""

BatchObserver = Callable[[int, float], None]
"""Called on the event loop with (operations in the batch, seconds the commit took)."""

_log = logging.getLogger(__name__)
_Batch = list[tuple[Operation, "asyncio.Future[Any]"]]
_Job = tuple[_Batch, list[Any] | None, Callable[[], None] | None]  # results (None: retry), after commit
_STOP = object()
LINGER_AFTER = 4
# An operation's early preparation (the `early` thread's): queued, under way, done, failed.
_QUEUED, _RUNNING, _PREPARED, _FAILED = range(4)


class GroupCommitter:
    """Owns the spool's write connection, its batching, and the thread that commits."""

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        *,
        window: float = 0.002,
        max_batch: int = 1024,
        observer: BatchObserver | None = None,
        before_commit: BeforeCommit | None = None,
        flush: Flusher | None = None,
        no_room: NoRoom | None = None,
    ) -> None:
        """`flush` runs in the commit thread after the operations' `prepare` and before the
        COMMIT: what they wrote is made durable there once for the whole batch. `no_room`: see
        `NoRoom`."""
        self._connect = connect
        self._no_room = no_room
        self._before_commit = before_commit
        self._flush = flush
        self._window = window
        self._max_batch = max_batch
        self._observer = observer
        self._conn: sqlite3.Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._commit_thread: threading.Thread | None = None
        self._pending: _Batch = []
        self._scheduled = False
        self._lingering: asyncio.TimerHandle | None = None
        self._in_flight = False
        self._closed = False
        self._idle = threading.Event()
        self._idle.set()
        # Early preparation (only with a `flush`: what it makes durable is what is worth it).
        self._early_jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._early_thread: threading.Thread | None = None
        self._early_state: dict[int, int] = {}  # id() of an operation queued early -> its state
        self._early_changed = threading.Condition()
        self._eager: dict[int, Once] = {}  # id() of a pending future -> its `then`

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._conn = self._connect()
        self._commit_thread = threading.Thread(target=self._run, name="spool-commit", daemon=True)
        self._commit_thread.start()
        if self._flush is not None:
            self._early_thread = threading.Thread(target=self._run_early, name="spool-early", daemon=True)
            self._early_thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(
        self, op: Operation, *, then: Callable[[asyncio.Future[Any]], None] | None = None
    ) -> asyncio.Future[Any]:
        """Queue `op`; the future resolves once it is durable (or fails with a SpoolError).

        `then(future)`: a done callback, called once: by the loop callback that completes the
        batch, right after its futures are resolved, instead of one loop turn later as the
        future's own callbacks are (each such hop waits for every other callback and read of
        a busy loop: measured on the realistic relay bench, the two hops from COMMIT to 250 were
        a quarter of the time from end of data to 250). Still registered on the future, so it
        runs if the future ends otherwise (cancelled, or failed at once)."""
        loop = self._loop
        assert loop is not None, "start() first"
        future = loop.create_future()
        if then is not None:
            once = Once(then)
            future.add_done_callback(once)
        if self._closed:
            op.abandon()
            future.set_exception(SpoolClosed("spool is closed"))
            return future
        if then is not None:
            self._eager[id(future)] = once
        self._pending.append((op, future))
        if (self._in_flight or self._lingering is not None) and self._early_thread is not None and _early(op):
            # It waits for a batch: its files are written and flushed meanwhile.
            with self._early_changed:
                self._early_state[id(op)] = _QUEUED
            self._early_jobs.put(op)
        if not self._in_flight and not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._start_batch)
        elif self._lingering is not None and len(self._pending) >= self._max_batch:
            self._lingering.cancel()  # a full batch waits for nothing
            self._lingering = None
            loop.call_soon(self._start_batch)
        return future

    def close(self) -> None:
        """Stop taking work, let the commit in flight finish, stop the thread.

        Call from the event loop thread after the last `submit()`; operations still waiting
        for a batch are committed first, here, synchronously.
        """
        if self._closed:
            return
        self._closed = True
        self._idle.wait()
        while self._pending:
            self._finish(*self._begin(self._take()))
        self._jobs.put(_STOP)
        if self._commit_thread is not None:
            self._commit_thread.join()
        self._early_jobs.put(_STOP)
        if self._early_thread is not None:
            self._early_thread.join()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # --- event loop side ---------------------------------------------------------------
    def _take(self) -> _Batch:
        batch = self._pending[: self._max_batch]
        del self._pending[: self._max_batch]
        return batch

    def _start_batch(self) -> None:
        self._scheduled = False
        self._lingering = None
        if self._in_flight or not self._pending or self._conn is None:
            return
        self._in_flight = True
        self._idle.clear()
        self._jobs.put(self._begin(self._take()))

    def _begin(self, batch: _Batch) -> _Job:
        """BEGIN and run the batch's SQL here, its `before_commit` too: the commit thread then
        needs the GIL for nothing but handing the batch back. The job's results are None if
        the batch must be retried one operation at a time."""
        conn = self._conn
        assert conn is not None
        try:
            conn.execute("BEGIN IMMEDIATE")
            results = [op.apply(conn) for op, _ in batch]
            after = self._before_commit(conn, [op for op, _ in batch]) if self._before_commit else None
            return batch, results, after
        except Exception:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return batch, None, None

    def _batch_done(self, batch: _Batch, results: list[Any], seconds: float) -> None:
        # Everything but the COMMIT happens here, on the loop: the commit thread hands over
        # and goes back to waiting, instead of competing with the loop for the GIL.
        if self._observer is not None:
            self._observer(len(batch), seconds)
        eager: list[tuple[Once, asyncio.Future[Any]]] = []
        for (op, future), result in zip(batch, results, strict=True):
            if isinstance(result, SpoolError):
                op.abandon()
            once = self._eager.pop(id(future), None)
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
            if once is not None:
                eager.append((once, future))
        self._in_flight = False
        if self._pending and not self._closed:
            if self._window > 0 and LINGER_AFTER <= len(self._pending) < self._max_batch:
                assert self._loop is not None
                self._scheduled = True
                self._lingering = self._loop.call_later(self._window, self._start_batch)
            else:
                self._start_batch()
        # Last: a `then` may submit more (a client's next message), and the batch is over.
        for once, future in eager:
            try:
                once(future)
            except Exception as error:  # as the loop would for a done callback: say it, go on
                assert self._loop is not None
                self._loop.call_exception_handler(
                    {"message": "exception in a spool commit's callback", "exception": error, "future": future}
                )

    # --- commit thread -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            self._finish(*job)

    def _finish(self, batch: _Batch, applied: list[Any] | None, after: Callable[[], None] | None) -> None:
        """fsync the batch's files and COMMIT; on failure, retry each operation alone."""
        conn = self._conn
        assert conn is not None
        started = time.perf_counter()
        ops = [op for op, _ in batch]
        results: list[Any]
        if applied is not None:
            try:
                prepared = self._claim(ops)
                since = self._flush.mark() if self._flush is not None else 0
                for op in ops:
                    if id(op) not in prepared:
                        op.prepare()
                if self._flush is not None:
                    self._flush.flush(since)
                conn.execute("COMMIT")
            except Exception as error:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if len(ops) == 1 and not self._made_room(conn, error):
                    results = [_spool_error(error)]
                else:
                    results = [self._one(conn, op) for op in ops]
            else:
                _after_commit(after)
                results = applied
        else:
            self._claim(ops)  # (each is prepared again, alone)
            results = [self._one(conn, op) for op in ops]
        seconds = time.perf_counter() - started
        loop = self._loop
        assert loop is not None
        if threading.current_thread() is self._commit_thread:
            self._idle.set()
            try:
                loop.call_soon_threadsafe(self._batch_done, batch, results, seconds)
            except RuntimeError:
                pass  # the loop is closed: nobody is waiting for the answers
        else:
            self._batch_done(batch, results, seconds)
            self._idle.set()

    def _claim(self, ops: list[Operation]) -> set[int]:
        """Take the batch's operations from the early thread (commit thread): the id() of those
        it made durable, after waiting for any it is preparing now. The rest it will not touch."""
        prepared: set[int] = set()
        if self._early_thread is None:
            return prepared
        with self._early_changed:
            states = self._early_state
            for op in ops:
                key = id(op)  # (an operation stays alive, and its id its own, until it is claimed)
                while states.get(key) == _RUNNING:
                    self._early_changed.wait()
                if states.pop(key, None) == _PREPARED:
                    prepared.add(key)
        return prepared

    # --- early thread ----------------------------------------------------------------------
    def _run_early(self) -> None:
        while True:
            job = self._early_jobs.get()
            ops = [job]
            while True:  # everything queued meanwhile: one flush for all
                try:
                    ops.append(self._early_jobs.get_nowait())
                except queue.Empty:
                    break
            if any(op is _STOP for op in ops):
                return
            self._prepare_early(ops)

    def _prepare_early(self, ops: list[Operation]) -> None:
        with self._early_changed:
            ops = [op for op in ops if self._early_state.get(id(op)) == _QUEUED]  # (not claimed yet)
            for op in ops:
                self._early_state[id(op)] = _RUNNING
        if not ops:
            return
        outcome = _PREPARED
        try:
            since = self._flush.mark() if self._flush is not None else 0
            for op in ops:
                op.prepare()
            if self._flush is not None:
                self._flush.flush(since)
        except Exception:
            outcome = _FAILED  # the batch prepares them again, and meets the error if it sticks
        with self._early_changed:
            for op in ops:
                self._early_state[id(op)] = outcome
            self._early_changed.notify_all()

    def _one(self, conn: sqlite3.Connection, op: Operation, retried: bool = False) -> Any:
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = op.apply(conn)
                since = self._flush.mark() if self._flush is not None else 0
                op.prepare()
                if self._flush is not None:
                    self._flush.flush(since)
                after = self._before_commit(conn, [op]) if self._before_commit else None
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except Exception as error:
            if not retried and self._made_room(conn, error):
                return self._one(conn, op, retried=True)
            return _spool_error(error)
        _after_commit(after)
        return result

    def _made_room(self, conn: sqlite3.Connection, error: Exception) -> bool:
        """Whether `error` was a full disk and `no_room` made room, so that the write that met it
        may be tried again (commit thread, after the ROLLBACK)."""
        return self._no_room is not None and isinstance(_spool_error(error), SpoolFull) and self._no_room(conn)


def _after_commit(after: Callable[[], None] | None) -> None:
    """Run what follows a durable COMMIT. The batch is committed whatever happens here."""
    if after is None:
        return
    try:
        after()
    except Exception:
        _log.exception("spool: committed, but the clean-up after the commit failed (the next start finishes it)")


def _spool_error(error: BaseException) -> SpoolError:
    if isinstance(error, SpoolError):
        return error
    if getattr(error, "sqlite_errorname", None) == "SQLITE_FULL":
        return SpoolFull(f"spool full: {error}")
    return SpoolWriteError(f"spool write failed: {type(error).__name__}: {error}")
