"""Done and failed marks on local disk, for single-node mode (`LocalArbiter`).

Without [redis] a node's claims live in its process, and so did its done marks. A node stopped
(or killed) after its target accepted messages and before the IMAP server took their
acknowledgement (the server unreachable, say) handed them all over again at its next start,
with nothing said. So a done mark is kept in a file of the node's spool too, `inbound-marks`,
until the source has the message's acknowledgement (or a keyword that keeps every search from
it), or `DONE_TTL` runs out; the next start finds it there and acknowledges the message instead
of handing it over (`LocalArbiter.claim`). A failed mark is kept likewise, until `DONE_TTL`.
Only the first worker watches mailboxes (`pigeon.node.inbound`): the file has one writer.

The file is a log of JSON lines, `[key, value, until (ms since the epoch), node name]`; a value
"" forgets the key. Each change is appended with one `write()`, a group of marks at a time (a
batch's, say): the kernel has it as soon as it is made, so a `kill -9` of the process loses
none. It is fsynced when the node starts and stops, not at each write, which would cost each
batch an fsync: a power failure of the machine can lose the marks of the run under way, and what
they kept from the target is then handed over again, with the same dedupe key (as it is after a
Redis that lost its data). A line cut short by a crash is left out when the file is read.

It stays the size of what waits for an acknowledgement: at each start, when it has grown past
`_COMPACT_AT` lines more than the marks it holds, and when the node stops, it is written anew
beside itself with the marks that hold, and renamed into place (a crash meanwhile leaves one
file or the other, whole).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import msgspec

from pigeon.fsync import fsync_directory

_log = logging.getLogger(__name__)

MARKS_FILE: Final = "inbound-marks"
_COMPACT_AT: Final = 10_000  # lines beyond twice the marks held, before the file is written anew
_DECODER: Final = msgspec.json.Decoder(tuple[str, str, int, str])
_ENCODER: Final = msgspec.json.Encoder()


def marks_path(spool: Path) -> Path:
    """The file a node's done and failed marks outlive its process in, without [redis]."""
    return spool / MARKS_FILE


# A mark: its value as `LocalArbiter` holds it ("d:<token>", "f:<token>"), the time.time() it is
# forgotten at, and the `[node] name` of the process that made it ("": none). A plain tuple: one
# is made for each message handed over.
Mark = tuple[str, float, str]


class MarkFile:
    """The marks kept in `path`: `marks` those that hold, as last written. Made by `open`."""

    def __init__(self, path: Path, node: str, marks: dict[str, Mark], fd: int) -> None:
        self.path = path
        self.node = node
        self.marks = marks
        self._fd = fd
        self._lines = len(marks)  # lines in the file
        self.error: str | None = None  # why the last write failed, until the file is whole again

    @classmethod
    def open(cls, path: Path, node: str) -> MarkFile:
        """The file's marks that hold now, the file written anew with them alone. Raises
        OSError when it cannot be read or written."""
        marks: dict[str, Mark] = {}
        now = time.time()
        with contextlib.suppress(FileNotFoundError), open(path, "rb") as stream:
            for line in stream:
                try:
                    key, value, until, name = _DECODER.decode(line)
                except msgspec.DecodeError:
                    continue  # cut short by a crash (or a disk that failed): that mark is lost
                if not value or until / 1000 <= now:
                    marks.pop(key, None)
                else:
                    marks[key] = (value, until / 1000, name)
        fd = _rewrite(path, marks, durable=True)
        return cls(path, node, marks, fd)

    def put(self, changes: Iterable[tuple[str, str, float]]) -> None:
        """Keep each (key, value, until) given, in one write."""
        node, marks, encode = self.node, self.marks, _ENCODER.encode  # (per message: kept short)
        lines = []
        for key, value, until in changes:
            marks[key] = (value, until, node)
            lines.append(encode((key, value, int(until * 1000), node)))
        self._append(lines)

    def forget(self, keys: Iterable[str]) -> None:
        """Forget the marks of `keys` (those kept), in one write."""
        marks, encode = self.marks, _ENCODER.encode
        self._append([encode((key, "", 0, "")) for key in keys if marks.pop(key, None) is not None])

    def close(self) -> None:
        """Written anew with the marks that hold, fsynced, and closed: what the next start finds."""
        try:
            now = time.time()
            fd = _rewrite(self.path, {k: m for k, m in self.marks.items() if m[1] > now}, durable=True)
        except OSError as error:
            _log.error("inbound: cannot write %s as the node stops: %s; what it keeps from the next start may be lost",
                       self.path, error)  # fmt: skip
            with contextlib.suppress(OSError):
                os.fsync(self._fd)
        else:
            os.close(fd)
        os.close(self._fd)

    def _append(self, lines: list[bytes]) -> None:
        """Lines (without their newlines) at the end of the file, in one write."""
        if not lines:
            return
        if self.error is not None:
            # What failed to be written is missing from the file (and it may end with half a
            # line): it is written anew, whole, instead.
            self._compact()
            return
        data = b"\n".join(lines) + b"\n"
        try:
            written = 0
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError as error:
            self._failed(error)
            return
        self._lines += len(lines)
        if self._lines > _COMPACT_AT + 2 * len(self.marks):
            self._compact()

    def _compact(self) -> None:
        """The file written anew with the marks that hold."""
        now = time.time()
        self.marks = {key: mark for key, mark in self.marks.items() if mark[1] > now}
        try:
            fd = _rewrite(self.path, self.marks, durable=False)
        except OSError as error:
            if self.error is not None:
                self._failed(error)
            else:  # (the file has every mark: it only grows on, and is tried again as many lines later)
                _log.warning("inbound: cannot write %s anew: %s; it goes on growing", self.path, error)
                self._lines = 0
            return
        os.close(self._fd)
        self._fd = fd
        self._lines = len(self.marks)
        if self.error is not None:
            _log.info("inbound: done marks are kept in %s again", self.path)
            self.error = None

    def _failed(self, error: OSError) -> None:
        """A write failed: the marks stay in memory, the file lacks some until it is written
        anew. Said once (a full disk would say it at every batch), and when it works again."""
        if self.error is None:
            _log.error("inbound: cannot keep done marks in %s: %s; until it can, a restart would hand over again "
                       "what is handed over and not acknowledged at the source", self.path, error)  # fmt: skip
        self.error = str(error)


def _rewrite(path: Path, marks: dict[str, Mark], *, durable: bool) -> int:
    """`path` replaced by a file of `marks` alone (written beside it, then renamed: a crash
    leaves the old one or the new one); the new one's descriptor, to append to. `durable`:
    fsynced, its name too."""
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        data = b"".join(_ENCODER.encode((key, value, int(until * 1000), node)) + b"\n"
                        for key, (value, until, node) in marks.items())  # fmt: skip
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        if durable:
            os.fsync(fd)
        os.replace(temporary, path)
        if durable:
            fsync_directory(path.parent)
    except BaseException:
        os.close(fd)
        raise
    return fd
