"""Message framing: DATA's dot-terminated stream and the checks every message body gets.

`DotReader` finds the end of DATA. It is deliberately strict, because SMTP smuggling
(SEC Consult, 2023) lives in the gap between what two MTAs consider the end of DATA:

* DATA ends only at ``<CRLF>.<CRLF>``, where the first CRLF is the real end of the previous
  line (or DATA just began). ``\\n.\\n``, ``\\r.\\r``, ``\\n.\\r\\n``, ``\\r\\n.\\n`` and every other
  variant are message content, never an end;
* a bare LF or bare CR never ends or splits a line: the dot that follows one is not at the
  start of a line, so it is neither a terminator nor unstuffed;
* a NUL octet is refused (RFC 5322 and RFC 6152 allow none, and some MTAs truncate there);
* dot-unstuffing (RFC 5321 4.5.2) removes exactly one leading dot from each line.

`ContentChecker` then looks at the unstuffed bytes, from DATA or from BDAT chunks alike
(a message received with BDAT and relayed with DATA would otherwise carry a smuggled end to
the next hop): bare LF and bare CR (refused, or normalised to CRLF), lines over the limit,
and the size.

Both work on whole blocks. The scans that look at every byte (`inspect`, `find_line_dot`) are
in C (`_scan.c`, built at install) when a compiler was there, and in Python, with the same
answers, when not.

Messages that do not arrive over SMTP meet the same checker (`check_message`: a message
composed from an HTTP injection), and `crlf_lines` is what the SMTP client sends whatever
the spool holds: every line ended by CRLF, so that its dot-stuffing works on whole lines and
no bare LF or CR reaches a next hop that might take one for a line end.
"""

from __future__ import annotations

import enum
import re
from typing import Final

from pigeon.smtp import replies
from pigeon.smtp.replies import Reply

_BARE_ENDING: Final = re.compile(rb"\r\n|\r|\n")


class BareLinefeeds(enum.Enum):
    """What to do with a message that has a bare LF or bare CR."""

    REFUSE = "refuse"
    NORMALISE = "normalise"


class Violation(enum.Enum):
    """Why a message body is refused. The order is the order of precedence in replies."""

    TOO_BIG = "too_big"
    LINE_TOO_LONG = "line_too_long"
    BARE_LF = "bare_lf"
    BARE_CR = "bare_cr"
    NUL = "nul"


# The reply for each violation, in order of precedence (a message has one answer).
_REFUSALS: Final = (
    (Violation.TOO_BIG, None),  # needs the limit: built in refusal()
    (Violation.LINE_TOO_LONG, None),  # likewise
    (Violation.BARE_LF, replies.CONTENT_BARE_LF),
    (Violation.BARE_CR, replies.CONTENT_BARE_CR),
    (Violation.NUL, replies.CONTENT_NUL),
)


# What `inspect` finds in a block of message bytes.
BARE_LF: Final = 1  # an LF not after a CR
BARE_CR: Final = 2  # a CR not before an LF (one ending the block too)
NUL: Final = 4
LONG_LINE: Final = 8  # a line longer than the limit
_NO_LIMIT: Final = 1 << 60


def _inspect(data: bytes, carried: int, limit: int) -> tuple[int, int]:
    """`inspect` in Python: the flags found in `data`, and the length of its unfinished last
    line. `carried` is the unfinished line the previous block ended with."""
    flags = 0
    crlf = data.count(b"\r\n")
    if data.count(b"\n") != crlf:
        flags |= BARE_LF
    if data.count(b"\r") != crlf:
        flags |= BARE_CR
    if b"\0" in data:
        flags |= NUL
    first = data.find(b"\n")
    if first < 0:
        tail = carried + len(data)
        return (flags | LONG_LINE if tail > limit + 1 else flags), tail
    if _line_length(data[:first], carried) > limit:
        flags |= LONG_LINE
    # Every line must end within `window` bytes of its start. Jump from line start to the
    # last LF inside the window: one C-level rfind per ~1000 bytes, not per line.
    window = limit + 2
    end = len(data)
    pos = first + 1
    while end - pos >= window:
        last = data.rfind(b"\n", pos, pos + window)
        if last < 0:
            flags |= LONG_LINE
            break
        pos = last + 1
    tail = data.rfind(b"\n", pos)
    return flags, end - (tail + 1 if tail >= 0 else pos)


def _find_line_dot(data: bytes | bytearray, start: int) -> int:
    return data.find(b"\r\n.", start)


try:
    from pigeon.smtp._scan import find_line_dot as find_line_dot
    from pigeon.smtp._scan import inspect as inspect
except ImportError:  # built without a C compiler: the same scans, slower
    inspect, find_line_dot = _inspect, _find_line_dot


def crlf_lines(data: bytes) -> bytes:
    """`data` with every bare LF and bare CR made a CRLF; the same object when there is none."""
    if not inspect(data, 0, _NO_LIMIT)[0] & (BARE_LF | BARE_CR):
        return data
    return _BARE_ENDING.sub(b"\r\n", data)


def check_message(data: bytes, *, max_size: int, max_line_length: int, uncounted: int = 0) -> Reply | None:
    """The reply refusing a whole message held in memory, as SMTP reception would refuse it
    (bare LF or CR, NUL, over-long line, too big), or None when it may be stored. `uncounted`:
    octets of `data` that Pigeon wrote itself (an injection's Date and Message-ID), which
    `max_size` does not count, as SMTP counts none of the fields it adds."""
    checker = ContentChecker(max_size=max_size, max_line_length=max_line_length, bare_linefeeds=BareLinefeeds.REFUSE)
    checker.size = -uncounted
    checker.feed(data)
    checker.finish()
    return checker.refusal()


class ContentChecker:
    """Checks (and in normalise mode repairs) message bytes fed to it in any split.

    `feed()` returns the bytes to store. Once the message is over `max_size` it returns b""
    for the rest: there is no point in keeping bytes that will be refused.
    """

    __slots__ = ("_held_cr", "_line_len", "_max_line", "_max_size", "_normalise", "size", "violations")

    def __init__(self, *, max_size: int, max_line_length: int, bare_linefeeds: BareLinefeeds) -> None:
        self._max_size = max_size
        self._max_line = max_line_length
        self._normalise = bare_linefeeds is BareLinefeeds.NORMALISE
        self._held_cr = False  # the previous block ended in CR: its LF may be next
        self._line_len = 0  # length of the unfinished line at the end of the previous block
        self.size = 0
        self.violations: set[Violation] = set()

    @property
    def doomed(self) -> bool:
        return bool(self.violations)

    def feed(self, data: bytes) -> bytes:
        if self._held_cr:
            data = b"\r" + data
            self._held_cr = False
        if data.endswith(b"\r"):
            # It may be the first half of a CRLF split across two blocks: decide next time.
            data = data[:-1]
            self._held_cr = True
        if not data:
            return b""
        flags, tail = inspect(data, self._line_len, self._max_line)
        if flags & NUL:
            self.violations.add(Violation.NUL)
        if flags & (BARE_LF | BARE_CR):
            if self._normalise:
                data = crlf_lines(data)
                # The lines that will be stored are the normalised ones.
                flags, tail = inspect(data, self._line_len, self._max_line)
            else:
                if flags & BARE_LF:
                    self.violations.add(Violation.BARE_LF)
                if flags & BARE_CR:
                    self.violations.add(Violation.BARE_CR)
        if flags & LONG_LINE:
            self.violations.add(Violation.LINE_TOO_LONG)
        self._line_len = tail
        self.size += len(data)
        if self.size > self._max_size:
            self.violations.add(Violation.TOO_BIG)
        return b"" if self.violations else data

    def finish(self) -> bytes:
        """End of message: settle a trailing CR. Returns any last bytes to store."""
        tail = b""
        if self._held_cr:
            self._held_cr = False
            if self._normalise:
                tail = b"\r\n"
                self.size += 2
            else:
                self.violations.add(Violation.BARE_CR)
        if self._line_len > self._max_line:
            self.violations.add(Violation.LINE_TOO_LONG)
        if self.size > self._max_size:
            self.violations.add(Violation.TOO_BIG)
        return b"" if self.violations else tail

    def refusal(self) -> Reply | None:
        """The reply that refuses the message (the first violation by precedence), or None."""
        for violation, reply in _REFUSALS:
            if violation in self.violations:
                if violation is Violation.TOO_BIG:
                    return replies.message_too_big(self._max_size)
                if violation is Violation.LINE_TOO_LONG:
                    return replies.content_line_too_long(self._max_line)
                return reply
        return None


def _line_length(segment: bytes, carried: int) -> int:
    """Length of a line's text: the bytes before its LF, not counting the CR of a CRLF."""
    n = carried + len(segment)
    return n - 1 if segment.endswith(b"\r") else n


class DotReader:
    """Reads DATA content from a buffer up to the terminating ``<CRLF>.<CRLF>``.

    It only ever takes whole lines from the buffer; an unfinished line stays there until its
    LF arrives. `read()` returns ``(content, ended)``: unstuffed content (maybe empty) and
    whether the terminator was consumed. Bytes after the terminator (pipelined commands)
    stay in the buffer.
    """

    __slots__ = ("_at_line_start", "_max_line", "overlong")

    def __init__(self, max_line_length: int) -> None:
        self._at_line_start = True  # DATA's 354 counts as the end of a line
        self._max_line = max_line_length
        self.overlong = False  # an unfinished line grew past the limit and was dropped

    def read(self, buf: bytearray) -> tuple[bytes, bool]:
        last_lf = buf.rfind(b"\n")
        if last_lf < 0:
            self._drop_overlong_partial(buf)
            return b"", False
        # The block is buf[: last_lf + 1], the whole lines: searched in place, copied once.
        # One search answers both questions in the usual case: the first line starting with
        # a dot is the terminator, so there is nothing to unstuff before it.
        stuffed = False
        if self._at_line_start and buf.startswith(b".\r\n"):
            end = 0
        else:
            dot = find_line_dot(buf, 0)
            if dot < 0 or dot + 1 == last_lf:  # none, or its dot is past the block
                end = -1
            elif buf.startswith(b"\r\n", dot + 3):
                end = dot + 2
            else:
                stuffed = True
                found = buf.find(b"\r\n.\r\n", dot, last_lf + 1)
                end = found + 2 if found >= 0 else -1
        taken = end if end >= 0 else last_lf + 1
        with memoryview(buf) as view:
            content = view[:taken].tobytes()
        if end >= 0:
            del buf[: end + 3]
        else:
            ends_crlf = last_lf > 0 and buf[last_lf - 1] == 13
            del buf[: last_lf + 1]
            self._drop_overlong_partial(buf)
        if self._at_line_start and content.startswith(b"."):
            content = content[1:]
        if stuffed:
            content = content.replace(b"\r\n.", b"\r\n")
        if end < 0:
            self._at_line_start = ends_crlf
        return content, end >= 0

    def _drop_overlong_partial(self, buf: bytearray) -> None:
        # An unfinished line longer than any legal one can be neither the terminator nor
        # content we will keep. Keep its last byte (a CR whose LF may follow) and move on,
        # so a client cannot make us buffer without bound.
        if len(buf) > self._max_line + 2:
            self.overlong = True
            self._at_line_start = False
            del buf[:-1]
