"""Maildir: each message written to tmp/, made durable, then linked into new/.

The file name is the dedupe key, so a message handed over twice lands once: if it is already
in new/ (or was moved to cur/ by a reader), the second handoff is accepted and writes nothing.

A batch is written as a group, as the spool commits: every file written to tmp/ and made
durable, then each linked into new/ and new/ made durable. Nothing counts as accepted before
its file and its name in new/ are on disk, and no name reaches new/ before its file's bytes
are on disk (a name there is what the dedupe trusts).

"Made durable" is one syncfs(2) of the Maildir's filesystem for the whole batch where Linux
has it (5.8 and later, where it reports a failed write-back) and the filesystem is a local one
it is known to make durable (ext4, xfs, btrfs...): one journal commit and one cache flush.
Measured here (50 files of 5 KiB a batch), it wrote 1.7-3x as many messages a second as an
fsync per file (16 at once, which the journal mostly folds into a few commits), at a third to
a half of the CPU. It also writes out what other programs left unsynced on that filesystem, as
ext4's per-file fsync often does too; a Maildir on a disk shared with heavy unsynced writers
can give it its own filesystem.
Elsewhere, or if syncfs is refused (a sandbox), each file is fsynced, side by side, then new/.

A mailbox has the first half (files written to tmp/ and made durable: `prepare`) done while
the batch before is handed over and acknowledged, and the second (linked into new/, new/ made
durable: `deliver_prepared`) once it is: nothing in tmp/ is mail a reader sees, so what a kill
can hand over twice is unchanged. Writing the files was most of a batch's time (2-5 times the
linking), and the mailbox's acknowledgement of the batch before waited behind it. Sharp edges:
two batches' files may be open at once (a descriptor each, until linked), and a kill -9 may
leave two batches' files in tmp/ (one before), which no reader takes and the next start
removes.

The batch's file work (a stat, open, write and close of each file, then its link and unlink)
runs in C (`_maildir.c`) where it was built, in one release of the GIL: from Python, each of
those calls waits to take the GIL back from the event loop, busy parsing the next fetch. With
that loop busy, writing a batch took 2-5 times as long. `_write_files` and `_link_files` are
the same in Python, for an install without a compiler.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final, cast

from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Handoff, Prepared, Target, Verdict

_log = logging.getLogger(__name__)
_SYNCERS: Final = 16  # fsyncs at once: past a dozen or so, a journal commit takes no more of them


# Where syncfs makes durable what an fsync of each file would: local filesystems whose sync
# commits their journal (or tree) and flushes the disk's cache. Not network or FUSE ones, where
# syncfs may not reach the server (FUSE before Linux 5.15, or a server without FUSE_SYNCFS).
_SYNCFS_FILESYSTEMS: Final = frozenset({"ext3", "ext4", "xfs", "btrfs", "f2fs", "tmpfs"})
_SYNCFS_REFUSED: Final = frozenset({errno.ENOSYS, errno.EPERM, errno.EINVAL})  # a sandbox's seccomp, say


def _find_syncfs() -> Callable[[int], int] | None:
    # Before Linux 5.8 syncfs returned 0 even when writing back failed: not to be trusted.
    if not sys.platform.startswith("linux") or _kernel() < (5, 8):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        return None
    syncfs.argtypes, syncfs.restype = [ctypes.c_int], ctypes.c_int
    return cast(Callable[[int], int], syncfs)


def _kernel() -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return (int(found[1]), int(found[2])) if found else (0, 0)


_syncfs: Final = _find_syncfs()


def _sync_filesystem(fd: int) -> None:
    """Everything written to `fd`'s filesystem, on disk (or OSError: a failed write-back, as
    fsync reports it)."""
    assert _syncfs is not None
    if _syncfs(fd) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


_DUPLICATE: Final = Handoff(Verdict.ACCEPTED, "duplicate: already in the maildir")
# Whose a file in tmp/ is: "pigeon.<dedupe key>.<host>.<pid>". A file of a process of this host
# that is gone (kill -9 between writing and linking) is no mail anyone will link: removed at
# start. Another host's (a Maildir shared over the network) is left alone until it is older
# than the Maildir convention's 36 hours, as any program's left-overs there.
_HOST: Final = re.sub(r"[^A-Za-z0-9-]", "_", socket.gethostname()) or "localhost"
_STALE: Final = 36 * 3600.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # (another user's: there)
    return True


def _left_over(name: str, mtime: float, now: float) -> bool:
    """Whether a file of tmp/ is Pigeon's, and left by a process that will never link it."""
    if not name.startswith("pigeon."):
        return False  # another program's: its own to clean
    host, _, pid = name.split(".", 2)[-1].rpartition(".")
    if host == _HOST and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
        return True
    return now - mtime > _STALE


class _Written(Prepared):
    """A batch's files in tmp/, durable and still open, not linked into new/ yet."""

    def __init__(
        self, messages: tuple[InboundMessage, ...], answers: list[Handoff | None], written: list[tuple[str, Path, int]]
    ) -> None:
        self.messages = messages
        self.answers = answers
        self._written = written

    def matches(self, messages: Sequence[InboundMessage]) -> bool:
        """Whether these are the messages prepared, in the same order (not a part of them:
        two copies of one message share a file, which the first one's answer stands for)."""
        return len(messages) == len(self.messages) and all(a is b for a, b in zip(messages, self.messages, strict=True))

    def take(self) -> list[tuple[str, Path, int]]:
        """The files, for whoever links them (and discards what it does not link)."""
        written, self._written = self._written, []
        return written

    async def discard(self) -> None:
        written = self.take()
        if written:
            await asyncio.to_thread(MaildirTarget._discard, written)


@contextlib.contextmanager
def _directory(path: Path) -> Iterator[int]:
    """A descriptor of the directory `path`, for the *at() calls of a batch."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def _write_files(
    new: int, names: list[bytes], tmp: int, tmp_names: list[bytes], heads: list[bytes], bodies: list[bytes]
) -> list[int]:
    """`_maildir.write_files` in Python: for each message, -1 if `names[i]` is in `new`
    already, else the open descriptor of `tmp_names[i]` in `tmp`, holding heads[i] + bodies[i].
    On an error the files made so far are closed and removed."""
    fds: list[int] = []
    try:
        for name, tmp_name, head, body in zip(names, tmp_names, heads, bodies, strict=True):
            try:
                os.stat(name, dir_fd=new)
                fds.append(-1)
                continue
            except OSError:
                pass
            fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666, dir_fd=tmp)
            fds.append(fd)
            for part in (head, body):
                view = memoryview(part)
                while view:
                    view = view[os.write(fd, view) :]
    except OSError:
        for fd, tmp_name in zip(fds, tmp_names, strict=False):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                    os.unlink(tmp_name, dir_fd=tmp)
        raise
    return fds


def _link_files(tmp: int, tmp_names: list[bytes], new: int, names: list[bytes], fds: list[int]) -> tuple[int, int]:
    """`_maildir.link_files` in Python: each file closed, linked from `tmp` into `new` (there
    already counts as done) and its temporary name removed, in order, up to the first link
    that fails. (how many were handled, that link's errno or 0)."""
    for index, (tmp_name, name, fd) in enumerate(zip(tmp_names, names, fds, strict=True)):
        # Its bytes are on disk already; and a close that fails has still freed `fd` (Linux),
        # which must not be closed again, by whoever has it by then: as in C, not an error.
        with contextlib.suppress(OSError):
            os.close(fd)
        try:
            os.link(tmp_name, name, src_dir_fd=tmp, dst_dir_fd=new)
        except FileExistsError:
            pass  # another node wrote it meanwhile: the same bytes
        except OSError as error:
            return index + 1, error.errno or errno.EIO
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name, dir_fd=tmp)
    return len(fds), 0


try:
    from pigeon.inbound.targets._maildir import link_files as link_files
    from pigeon.inbound.targets._maildir import write_files as write_files
except ImportError:  # built without a C compiler
    write_files, link_files = _write_files, _link_files


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem `path` is on, from /proc/self/mounts (None: not known)."""
    try:
        mounts = Path("/proc/self/mounts").read_text()
    except OSError:
        return None
    where = str(path.resolve())
    deepest, kind = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal[1], 8)), fields[1])  # "\040" is a space
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(deepest):
            deepest, kind = point, fields[2]
    return kind


class MaildirTarget(Target):
    kind = "maildir"
    batches = True

    def __init__(self, name: str, path: Path) -> None:
        super().__init__(name, concurrency=4)
        self.path = path
        self._syncers: ThreadPoolExecutor | None = None
        self._whole_filesystem = False  # made durable by syncfs (found at start), else by fsyncs

    async def start(self) -> None:
        await asyncio.to_thread(self._make_directories)
        removed = await asyncio.to_thread(self._sweep)
        if removed:
            files = "1 file" if removed == 1 else f"{removed} files"
            _log.info("maildir %s: removed %s a stopped process left in tmp/ (never linked)", self.path, files)
        kind = await asyncio.to_thread(filesystem_type, self.path)
        self._whole_filesystem = _syncfs is not None and kind in _SYNCFS_FILESYSTEMS

    async def close(self) -> None:
        if self._syncers is not None:
            self._syncers.shutdown(wait=False)

    def _sweep(self) -> int:
        """Files left in tmp/ by a process killed between writing and linking them (see
        `_left_over`) removed: how many."""
        removed, now = 0, time.time()
        with os.scandir(self.path / "tmp") as entries:
            for entry in entries:
                with contextlib.suppress(OSError):  # (gone meanwhile: another node's sweep)
                    if _left_over(entry.name, entry.stat(follow_symlinks=False).st_mtime, now):
                        os.unlink(entry.path)
                        removed += 1
        return removed

    def _make_directories(self) -> None:
        for sub in ("tmp", "new", "cur"):
            (self.path / sub).mkdir(parents=True, exist_ok=True)

    async def deliver(self, message: InboundMessage) -> Handoff:
        return (await self.deliver_many([message]))[0]

    async def deliver_many(self, messages: Sequence[InboundMessage]) -> list[Handoff]:
        if not messages:
            return []
        if self._syncers is None:
            self._syncers = ThreadPoolExecutor(_SYNCERS, thread_name_prefix=f"maildir {self.name}")
        try:
            answers = await asyncio.to_thread(self._hand_over, messages, self._syncers)
        except OSError as error:
            return [self._failed(error)] * len(messages)
        return [
            answer or Handoff(Verdict.ACCEPTED, f"new/{self._name(m)}")
            for m, answer in zip(messages, answers, strict=True)
        ]

    async def prepare(self, messages: Sequence[InboundMessage]) -> Prepared | None:
        """The batch's files written to tmp/ and made durable, not linked: nothing a reader
        of new/ sees. `deliver_prepared` links them, which is most of what is left to do."""
        if not messages:
            return None
        if self._syncers is None:
            self._syncers = ThreadPoolExecutor(_SYNCERS, thread_name_prefix=f"maildir {self.name}")
        try:
            answers, written = await asyncio.to_thread(self._prepare_files, messages, self._syncers)
        except OSError:
            return None  # done again by deliver_prepared, which then answers with the error
        return _Written(tuple(messages), answers, written)

    async def deliver_prepared(self, messages: Sequence[InboundMessage], prepared: Prepared | None) -> list[Handoff]:
        if not isinstance(prepared, _Written) or not prepared.matches(messages):
            return await super().deliver_prepared(messages, prepared)
        try:
            await asyncio.to_thread(self._publish_files, prepared.take())
        except OSError as error:
            return [self._failed(error)] * len(messages)
        return [
            answer or Handoff(Verdict.ACCEPTED, f"new/{self._name(m)}")
            for m, answer in zip(messages, prepared.answers, strict=True)
        ]

    def _hand_over(self, messages: Sequence[InboundMessage], syncers: ThreadPoolExecutor) -> list[Handoff | None]:
        """The batch written, fsynced and linked (in a worker thread: one hop from the event
        loop for the batch). An answer for each message already there, None for the others."""
        answers, written = self._prepare_files(messages, syncers)
        self._publish_files(written)
        return answers

    def _prepare_files(
        self, messages: Sequence[InboundMessage], syncers: ThreadPoolExecutor
    ) -> tuple[list[Handoff | None], list[tuple[str, Path, int]]]:
        """`_write`, and the files made durable; nothing is left behind if that fails."""
        answers, written = self._write(messages)
        try:
            if written:
                self._durable([fd for _, _, fd in written], syncers)
        except BaseException:
            self._discard(written)
            raise
        return answers, written

    def _publish_files(self, written: list[tuple[str, Path, int]]) -> None:
        try:
            self._publish(written)
        finally:
            self._discard(written)  # what is left after a failure

    def _failed(self, error: OSError) -> Handoff:
        return Handoff(Verdict.TRANSIENT, f"maildir {self.path}: {error.strerror or error}")

    @staticmethod
    def _name(message: InboundMessage) -> str:
        return f"pigeon.{message.dedupe_key}"

    def _write(self, messages: Sequence[InboundMessage]) -> tuple[list[Handoff | None], list[tuple[str, Path, int]]]:
        """Each message not there yet written to tmp/ (not yet fsynced), its file left open:
        an answer for those already there, and (name, tmp file, descriptor) for the others."""
        self._make_directories()
        answers: list[Handoff | None] = []
        todo: list[InboundMessage] = []
        names: set[str] = set()
        # What a reader moved to cur/ (its flags after the ":"): looked at once per batch.
        read = {entry.partition(":")[0] for entry in os.listdir(self.path / "cur")}
        for message in messages:
            name = self._name(message)
            if name in names or name in read:
                answers.append(_DUPLICATE)
                continue
            names.add(name)
            answers.append(None)
            todo.append(message)
        finals = [self._name(m) for m in todo]
        temporaries = [f"{name}.{_HOST}.{os.getpid()}" for name in finals]
        with _directory(self.path / "new") as new, _directory(self.path / "tmp") as tmp:
            # The envelope on top (Return-Path, X-Original-To): the file is all the
            # application gets, and the header need not name the address it came to.
            fds = write_files(
                new,
                [os.fsencode(name) for name in finals],
                tmp,
                [os.fsencode(name) for name in temporaries],
                [m.envelope_header() for m in todo],
                [m.raw for m in todo],
            )
        written = [
            (name, self.path / "tmp" / temporary, fd)
            for name, temporary, fd in zip(finals, temporaries, fds, strict=True)
            if fd >= 0
        ]
        if len(written) < len(todo):  # some were in new/ already: their answers say so
            there = {name for name, fd in zip(finals, fds, strict=True) if fd < 0}
            answers = [
                _DUPLICATE if answer is None and self._name(m) in there else answer
                for m, answer in zip(messages, answers, strict=True)
            ]
        return answers, written

    def _publish(self, written: list[tuple[str, Path, int]]) -> None:
        """Each written file linked into new/, then new/ fsynced: the names are on disk too."""
        if written:
            with _directory(self.path / "tmp") as tmp, _directory(self.path / "new") as new:
                published, error = link_files(
                    tmp,
                    [os.fsencode(path.name) for _, path, _ in written],
                    new,
                    [os.fsencode(name) for name, _, _ in written],
                    [fd for _, _, fd in written],
                )
            del written[:published]  # closed and linked: not closed again
            if error:
                raise OSError(error, os.strerror(error))
        directory = os.open(self.path / "new", os.O_RDONLY)
        try:
            self._durable([directory], None)
        finally:
            os.close(directory)

    def _durable(self, fds: list[int], syncers: ThreadPoolExecutor | None) -> None:
        """What was written to `fds` on disk: one syncfs of the Maildir's filesystem, or an
        fsync each (side by side on `syncers`)."""
        if self._whole_filesystem:
            try:
                _sync_filesystem(fds[0])
                return
            except OSError as error:
                if error.errno not in _SYNCFS_REFUSED:
                    raise
                _log.warning("maildir %s: syncfs refused (%s): each file is fsynced instead", self.path, error)
                self._whole_filesystem = False
        if syncers is None or len(fds) == 1:
            for fd in fds:
                os.fsync(fd)
        else:
            for _ in syncers.map(os.fsync, fds):
                pass

    @staticmethod
    def _discard(written: list[tuple[str, Path, int]]) -> None:
        while written:
            _, tmp, fd = written.pop()
            with contextlib.suppress(OSError):
                os.close(fd)
                tmp.unlink(missing_ok=True)
