"""The header section of a message as it arrives, read for the intake.

Most of what the intake asks of a header section (the policy's `Headers`, the DKIM signers'
choice) is read from its first `KEPT` bytes: nearly every header section is far shorter,
and one of many megabytes must not be held whole, once per session.

Two questions are answered over the whole of it, however long:

* how many `Received:` fields it has. A loop must be found (RFC 5321 6.3) even when each
  hop adds more than a little above its Received field: a DKIM signature per hop (~700
  bytes) pushed the older ones past `KEPT` long before the 100th, and mail looped for ever;
* the first field of each routing header (`X-Tenant`, `X-Campaign`): it names the queue
  wherever it is, and is taken off before delivery wherever it is;
* which of the fields RFC 5322 3.6 allows once (`SINGLE_FIELDS`) it has, and whether one is
  there twice (`repeated_field`): a second From put far down, where the signer does not look,
  is still a second From to every reader and verifier of the message.

Past `KEPT` the bytes are scanned as they arrive, with C-speed bytes searches (a header
section of a million short lines costs no Python loop), and dropped: the last bytes of each
write are carried into the next scan, so that a field split between two writes is found
all the same, and counted once (in the scan that holds its last byte). A routing field
found there is kept, from its name to its end (as far as `KEPT`), so its value can be read.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

KEPT: Final = 64 * 1024
"""The bytes of the header section kept for policy and signing."""
_BLANKS: Final = 64  # blanks before a routing field's colon ("X-Tenant  :") found across two writes
_RECEIVED: Final = b"\nreceived:"
_FIELD_END: Final = re.compile(rb"\r\n[^ \t]")  # a line that does not continue the field before it
SINGLE_FIELDS: Final = ("From", "Sender", "Reply-To", "To", "Message-ID", "Subject", "Date")
"""Fields RFC 5322 3.6 allows at most once in a message, as they are usually spelt: those that
say who wrote it, to whom, what and when, which a reader shows one of and a verifier checks
(Gmail refuses mail with two). Cc, Bcc, In-Reply-To and References are allowed once too, but
mail with two of one still reaches people (RFC 5322 4.5's obsolete syntax allowed it): an MX
refusing it for good would lose mail no one can be misled by."""
_SINGLE_NAMES: Final = {name.lower().encode(): name for name in SINGLE_FIELDS}
# Any form of one at the start of a line, "From :" too (the obsolete form, RFC 5322 4.5:
# DKIM and mail readers take it for a From all the same).
_SINGLE_FIELD: Final = re.compile(rb"\n(" + b"|".join(map(re.escape, _SINGLE_NAMES)) + rb")[ \t]*:")


_FIELD_START: Final = rb"[!-9;-~]+[ \t]*:"  # a field's name and colon (RFC 5322 2.2; blanks before it, 4.5)
_FIRST_LINE: Final = re.compile(rb"\r\n|" + _FIELD_START)
_NOT_A_FIELD_LINE: Final = re.compile(rb"\r\n(?![ \t]|" + _FIELD_START + rb")")  # (the empty line too)
_UNDECIDED: Final = 4096  # octets of a line without its CRLF yet, past which it is read by its start


def repeated_field(lowered: bytes, late: list[bytes] | None = None) -> str | None:
    """The first of `SINGLE_FIELDS` that the lowered header section (from a leading LF) has
    more than once, counting `late` (the names `HeaderSection` found past its kept part), or
    None.

    One regex pass, tried only after each LF: 3.5 us on a usual 1 KiB header section (a
    Received field, a DKIM signature, ten others), where eleven `bytes.count` calls took 14,
    and 30 on 3 KiB of 80-octet X- fields (7 here)."""
    seen: set[bytes] = set()
    for found in _SINGLE_FIELD.findall(lowered):
        if found in seen:
            return _SINGLE_NAMES[found]
        seen.add(found)
    for found in late or ():
        if found in seen:
            return _SINGLE_NAMES[found]
        seen.add(found)
    return None


def single_fields(lowered: bytes, late: list[bytes] | None = None) -> set[str]:
    """Which of `SINGLE_FIELDS` the lowered header section has (with `late`, as above)."""
    return {_SINGLE_NAMES[found] for found in [*_SINGLE_FIELD.findall(lowered), *(late or ())]}


def repeated_field_in(message: bytes) -> str | None:
    """`repeated_field` of a whole message held in memory (CRLF line endings)."""
    return repeated_field(_lowered_head(message))


def single_fields_in(message: bytes) -> set[str]:
    """`single_fields` of a whole message held in memory (CRLF line endings)."""
    return single_fields(_lowered_head(message))


def _lowered_head(message: bytes) -> bytes:
    end = message.find(b"\r\n\r\n")
    return b"\n" + (message if end < 0 else message[: end + 2]).lower()


class RoutingNames:
    """What a scan looks for past `KEPT`: the routing headers' names (lower-case bytes)."""

    __slots__ = ("carry", "field", "fields", "markers", "names")

    def __init__(self, names: tuple[bytes, ...]) -> None:
        self.names = names
        # A routing field at the start of a line (blanks may come before its colon), in the
        # lowered header section: not "X-Campaign-Id:", nor "x-tenant" in a Subject.
        self.field = re.compile(rb"\n(?:" + b"|".join(map(re.escape, names)) + rb")[ \t]*:")
        self.fields = {name: re.compile(rb"\n" + re.escape(name) + rb"[ \t]*:") for name in names}
        self.markers = tuple(b"\n" + name for name in names)
        self.carry = (
            max(len(_RECEIVED), *(len(name) + 2 for name in _SINGLE_NAMES), *(len(m) for m in self.markers)) + _BLANKS
        )


class LateField(NamedTuple):
    """A routing field found past the kept part (or at its end)."""

    at: int
    """Where it starts in the header section (the offset of its name)."""
    text: bytearray
    """The field from its name on, as far as its end or `KEPT` bytes."""


class HeaderSection:
    """Fed every write of a message (ours, the Received header, first), up to its header
    section's end: `head` is what of it is kept, `late_received` and `late_fields` what was
    found after that."""

    __slots__ = (
        "_carry",
        "_first",
        "_offset",
        "_open",
        "_routing",
        "ended",
        "head",
        "late_fields",
        "late_received",
        "late_routing",
        "late_single",
    )

    def __init__(self, routing: RoutingNames) -> None:
        self._routing = routing
        self.head = bytearray()
        """The header section (with its last CRLF, without the empty line), or its first `KEPT` bytes."""
        self.ended = False
        """The empty line that ends the header section has come."""
        self.late_received = 0
        """`Received:` fields that start after `head` or end after it (counted nowhere else)."""
        self.late_routing = False
        """A line starting with a routing header's name came after `head` (or at its end)."""
        self.late_fields: dict[bytes, LateField] = {}
        """The first routing field of each name found after `head`, or in its last bytes (one
        that `head` cuts off is read whole here)."""
        self.late_single: list[bytes] = []
        """The lower-case names of the `SINGLE_FIELDS` found after `head` (or ending after it),
        in order; no more are looked for once one is there twice."""
        self._open: list[bytearray] = []  # late fields whose end has not come yet
        self._carry = b""
        self._offset = 0  # where the carry starts in the header section
        self._first = True  # the next scan's carry is the end of `head`

    def feed(self, data: bytes) -> None:
        head = self.head
        room = KEPT - len(head)
        if room > 0:
            # The common case: the whole header section in the kept part, found with one
            # search of the bytes just added (and the 3 before them: a CRLF CRLF split).
            start = len(head) - 3 if len(head) > 3 else 0
            head += data if len(data) <= room else data[:room]
            end = head.find(b"\r\n\r\n", start)
            if end >= 0:
                del head[end + 2 :]
                self.ended = True
                return
            if len(head) < KEPT:
                return
            self._carry = bytes(head[-self._routing.carry :])
            self._offset = KEPT - len(self._carry)
            data = data[room:]
            if not data:
                return
        self._scan(data)

    def _scan(self, data: bytes) -> None:
        """Past the kept part: count, and look for routing fields, in what came since the carry."""
        routing, carry = self._routing, self._carry
        text = carry + data
        lowered = text.lower()
        skip = len(carry)  # what was scanned before
        end = lowered.find(b"\r\n\r\n", max(0, skip - 3))
        limit = len(text) if end < 0 else end + 2
        # Only those ending in the new bytes: one wholly in the carry was counted already.
        self.late_received += lowered.count(_RECEIVED, max(0, skip - len(_RECEIVED) + 1), limit)
        single = self.late_single
        if len(single) <= len(_SINGLE_NAMES):  # past that one of them is repeated: no need to look on
            for found in _SINGLE_FIELD.finditer(lowered, 0, limit):
                if found.end() > skip:  # not one that ended in the carry: it was counted there
                    single.append(found.group(1))
                    if len(single) > len(_SINGLE_NAMES):
                        break
        if self._open:
            more = data[: max(0, limit - skip)]
            self._open = [field for field in self._open if _extend(field, more)]
        if not self.late_routing:
            self.late_routing = any(lowered.find(marker, 0, limit) >= 0 for marker in routing.markers)
        if self.late_routing and len(self.late_fields) < len(routing.fields):
            # One search per name not found yet, never a loop over every field found: a header
            # section of a million X-Tenant fields costs no more than one of other fields.
            for name, pattern in routing.fields.items():
                if name not in self.late_fields and (match := pattern.search(lowered, 0, limit)) is not None:
                    field = bytearray()
                    self.late_fields[name] = LateField(self._offset + match.start() + 1, field)
                    if _extend(field, text[match.start() + 1 : limit]):
                        self._open.append(field)
        if end >= 0:
            if self._first and end + 2 < skip:  # `head` ends in the "\r" of the empty line
                del self.head[end + 2 - skip :]
            self.ended = True
            self._open.clear()
        else:
            self._carry = text[-routing.carry :]
            self._offset += len(text) - len(self._carry)
            self._first = False


def _extend(field: bytearray, data: bytes) -> bool:
    """Add to a routing field what of `data` is still its own; whether more of it may follow."""
    start = len(field) - 2 if len(field) > 2 else 0  # a CRLF split between two writes
    field += data[: KEPT - len(field)]
    end = _FIELD_END.search(field, start)
    if end is not None:
        del field[end.start() + 2 :]
        return False
    return len(field) < KEPT


class HeaderEnd:
    """Where the content's header section ends, read as HTTP injection reads raw content
    (`pigeon.compose`), whichever door the message came in by: at the empty line, or at the
    first line that neither starts a field nor continues one, where the empty line is put in
    (as Postfix's cleanup does). Left as it came, such a line would be a broken field that
    Pigeon (its single-field and routing checks, the policy's `headers`, the DKIM signer) and
    each reader after it read their own way; content that starts with white space would even
    continue the field before it, Pigeon's own Received field.

    Each write of the content goes through `feed`, which returns what to store: the same
    bytes, but for that empty line and for the last line, held back until it is whole (its
    start says what it is). Once the header section has ended, `feed` is a no-op."""

    __slots__ = ("_first", "_held", "ended")

    def __init__(self) -> None:
        self._held = b""  # the line not judged yet, from the CRLF before it (none for the first)
        self._first = True
        self.ended = False

    def feed(self, data: bytes) -> bytes:
        """`data` as it is to be stored (see the class)."""
        if self.ended:
            return data
        return self._read(self._held + data if self._held else data, whole=False)

    def finish(self) -> bytes:
        """What is still held, once the content is complete: its last line, read as whole even
        without a CRLF. Nothing after the first call."""
        return self._read(self._held, whole=True) if self._held else b""

    def _read(self, text: bytes, *, whole: bool) -> bytes:
        self._held = b""
        if whole:
            end = len(text) - 2 if text.endswith(b"\r\n") else len(text)
        else:
            end = text.rfind(b"\r\n")  # the line after it may not be whole yet
            if (end < 0 and not self._first) or len(text) - max(end, 0) > _UNDECIDED:
                # The rest of a line already read by its start, or one that long (read so
                # now): stored as it comes, but for a CR that may begin the CRLF ending it.
                end = len(text) - 1 if text.endswith(b"\r") else len(text)
        if self._first:
            if end < 0:
                self._held = text
                return b""
            self._first = False
            if _FIRST_LINE.match(text) is None:  # not a field (white space, plain text): all is body
                self.ended = True
                return b"\r\n" + text
            if text.startswith(b"\r\n"):  # the empty line: no header section at all
                self.ended = True
                return text
        # Only whole lines are read: the search, and its look-ahead, stop at `end`.
        found = _NOT_A_FIELD_LINE.search(text, 0, end) if end > 0 else None
        if found is not None:
            self.ended = True
            at = found.end()
            if text.startswith(b"\r\n", at):  # the empty line: the header section ends as it should
                return text
            return text[:at] + b"\r\n" + text[at:]
        if whole or end >= len(text):
            return text
        self._held = text[end:]
        return text[:end]


def end_header_section(content: bytes) -> tuple[bytes, int]:
    """Whole `content` (CRLF line endings) with its header section ended as `HeaderEnd` ends
    it, and where that header section's fields end (0: it has none; at the empty line, or the
    content's end when it is all header)."""
    reader = HeaderEnd()
    data = reader.feed(content) + reader.finish()
    if data.startswith(b"\r\n"):
        return data, 0
    end = data.find(b"\r\n\r\n")
    return data, len(data) if end < 0 else end + 2
