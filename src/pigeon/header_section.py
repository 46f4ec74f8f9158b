"""The header section of a message as it arrives, read for the intake.

Most of what the intake asks of a header section (the policy's `Headers`, the DKIM signers'
choice) is read from its first `KEPT` bytes: nearly every header section is far shorter,
and one of many megabytes must not be held whole, once per session.

Two questions are answered over the whole of it, however long:

* how many `Received:` fields it has (`Received :` too). A loop must be found (RFC 5321 6.3) even when each
  hop adds more than a little above its Received field: a DKIM signature per hop (~700
  bytes) pushed the older ones past `KEPT` long before the 100th, and mail looped for ever;
* the first field of each routing header (`X-Tenant`, `X-Campaign`): it names the queue
  wherever it is, and is taken off before delivery wherever it is;
* which of the fields RFC 5322 3.6 allows once (`SINGLE_FIELDS`) it has, and whether one is
  there twice (`repeated_field`): a second From put far down, where the signer does not look,
  is still a second From to every reader and verifier of the message;
* the first From, Date and Message-ID field, read whole (`late_checked`), wherever it is: a
  submission must name its author (`author_missing`), and its Date and Message-ID must be of
  their RFC 5322 syntax (`malformed_field`; pure functions of a field's value, `date_problem`
  and `message_id_problem`, say what is wrong with one). A `Date: garbage` 88 KB down was
  seen as a Date (Pigeon added none) and not read, and left as it was.

Past `KEPT` the bytes are scanned as they arrive, with C-speed bytes searches (a header
section of a million short lines costs no Python loop), and dropped: the last bytes of each
write are carried into the next scan, so that a field split between two writes is found
all the same, and counted once (in the scan that holds its last byte). A routing field
found there is kept, from its name to its end (as far as `KEPT`), so its value can be read.
"""

from __future__ import annotations

import datetime
import re
from typing import Final, NamedTuple

from pigeon.logs.peer_text import shown

KEPT: Final = 64 * 1024
"""The bytes of the header section kept for policy and signing."""
_BLANKS: Final = 64  # blanks before a routing field's colon ("X-Tenant  :") found across two writes
_RECEIVED: Final = re.compile(rb"\nreceived[ \t]*:")
"""A Received field's start in the lowered header section (from a leading LF), "Received :"
too: the obsolete form (RFC 5322 4.5) is a Received field to every hop that counts them, and
the single-field and routing checks read it so. One regex pass costs less than counting
b"\\nreceived:" did (2.6 us against 6.4 on a usual 5 KiB header section)."""
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
_CHECKED_NAMES: Final = (b"from", b"date", b"message-id")
"""The fields whose value a submission is checked by (`author_missing`, `malformed_field`),
wherever in the header section they are: `HeaderSection.late_checked` keeps those past `KEPT`."""
_CHECKED_FIELDS: Final = {name: re.compile(rb"\n" + re.escape(name) + rb"[ \t]*:") for name in _CHECKED_NAMES}


_FIELD_START: Final = rb"[!-9;-~]+[ \t]*:"  # a field's name and colon (RFC 5322 2.2; blanks before it, 4.5)
_FIRST_LINE: Final = re.compile(rb"\r\n|" + _FIELD_START)
_NOT_A_FIELD_LINE: Final = re.compile(rb"\r\n(?![ \t]|" + _FIELD_START + rb")")  # (the empty line too)
_UNDECIDED: Final = 4096  # octets of a line without its CRLF yet, past which it is read by its start


def received_fields(lowered: bytes, end: int = -1) -> int:
    """How many Received fields the lowered header section (from a leading LF) has, in its
    first `end` bytes (-1: all of it), in either form (`_RECEIVED`)."""
    return len(_RECEIVED.findall(lowered, 0, len(lowered) if end < 0 else end))


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
            max(len(b"\nreceived:"), *(len(name) + 2 for name in _SINGLE_NAMES), *(len(m) for m in self.markers))
            + _BLANKS
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
        "late_checked",
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
        self.late_checked: dict[bytes, LateField] = {}
        """The first From, Date and Message-ID field found after `head` (keyed by lower-case
        name), or the one `head` cuts off, read whole (as far as `KEPT` bytes): what a
        submission is checked by is read wherever it is (`author_missing`, `malformed_field`)."""
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
            self._cut_off()
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
        # Only those ending in the new bytes: one wholly in the carry was counted already (no
        # two overlap, so those are the ones found in the carry alone).
        self.late_received += received_fields(lowered, limit) - received_fields(lowered, min(skip, limit))
        single = self.late_single
        checked: list[tuple[bytes, int]] = []  # a From, Date or Message-ID that starts here
        if len(single) <= len(_SINGLE_NAMES):  # past that one of them is repeated: no need to look on
            for found in _SINGLE_FIELD.finditer(lowered, 0, limit):
                if found.end() > skip:  # not one that ended in the carry: it was counted there
                    name = found.group(1)
                    single.append(name)
                    if name in _CHECKED_NAMES and name not in self.late_checked:
                        checked.append((name, found.start() + 1))
                    if len(single) > len(_SINGLE_NAMES):
                        break
        if self._open:
            more = data[: max(0, limit - skip)]
            self._open = [field for field in self._open if _extend(field, more)]
        for name, at in checked:  # (after the open ones are extended: these are read to `limit` now)
            if name not in self.late_checked:
                self._read_on(name, self._offset + at, text[at:limit])
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

    def _cut_off(self) -> None:
        """When `head` is full: the first From, Date or Message-ID field in it that its end
        cuts off (it may go on) is read on, whole, into `late_checked`. (One that ends in it is
        read there; a second of a name is refused as such, `repeated_field`.)"""
        head = self.head
        lowered = b"\n" + bytes(head).lower()
        for name in _CHECKED_NAMES:
            found = _CHECKED_FIELDS[name].search(lowered)
            if found is not None and _FIELD_END.search(head, found.end() - 1) is None:
                self._read_on(name, found.start(), head[found.start() :])

    def _read_on(self, name: bytes, at: int, text: bytes | bytearray) -> None:
        """Keep the checked field `name` that starts at `at` of the header section: `text`
        from its name on, as far as its end, and on with each write if it has not come."""
        field = bytearray()
        self.late_checked[name] = LateField(at, field)
        if _extend(field, bytes(text)):
            self._open.append(field)


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


# --- the Date and Message-ID a submission carries (RFC 5322 3.3, 3.6.4) -----------------------

_WEEKDAYS: Final = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_MONTHS: Final = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAY_NAMES: Final = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTH_NAMES: Final = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
                       "October", "November", "December")  # fmt: skip
# A date-time's tokens, read loosely (the obsolete syntax, 4.3, allows white space and comments
# between nearly all of them, and a comma after the day of the week only): each is then checked
# on its own, so that what is wrong can be said.
# (Read from its first non-blank to its last: no two runs of blanks meet, which would make a
# long run of them cost its square.)
_DATE_TIME: Final = re.compile(
    r"(?:(?P<weekday>[a-z]+)[ \t]*,[ \t]*)?(?P<day>[0-9]+)[ \t]*(?P<month>[a-z]+)[ \t]*(?P<year>[0-9]+)"
    r"[ \t]+(?P<hour>[0-9]+)[ \t]*:[ \t]*(?P<minute>[0-9]+)(?:[ \t]*:[ \t]*(?P<second>[0-9]+))?"
    r"(?:[ \t]*(?P<zone>[+-][0-9]+|[a-z]+))?",
    re.ASCII | re.IGNORECASE,
)
DATE_FORM: Final = '"Mon, 1 Jan 2024 12:00:00 +0000"'
"""A date-time as RFC 5322 3.3 writes one, for what is said of one that is not."""
_ZONE_FORM: Final = "+hhmm or -hhmm, e.g. +0100, -0500"


def date_problem(value: str) -> str | None:
    """What is wrong with a Date field's value (unfolded) as an RFC 5322 3.3 date-time, said of
    the value ("is not of the form ..."), or None if it is one.

    The obsolete forms of 4.3 that mailers still write are dates: no day of the week, a two
    or three digit year (00-49 is 2000-2049, else 1900 on), a named zone (UT, GMT, EST, ...,
    a military letter but J, and, as 4.3 says such zones are seen, any other of 2 to 5
    letters: UTC, CET), white space and comments between the parts, names in any case. Not
    one: what has no date, no time or no zone, or a part out of range (day 30 of February,
    hour 24, a year before 1900, a zone past +2359); a second of 60 is a leap second (3.3).
    Nor is one whose day of the week is not the date's: 3.3 says it MUST be, and a reader
    that shows "Mon" beside 5 Dec 2026 (a Saturday) shows a date no one can trust."""
    text = _without_comments(value)
    if text is None or (found := _DATE_TIME.fullmatch(text.strip(" \t"))) is None:
        return "is empty" if not value.strip(" \t") else f"is not of the form {DATE_FORM}"
    weekday, month = found["weekday"], found["month"]
    if weekday is not None and weekday.lower() not in _WEEKDAYS:
        return f'has "{weekday[:20]}" for a day of the week (Mon to Sun)'
    if month.lower() not in _MONTHS:
        return f'has "{month[:20]}" for a month (Jan to Dec)'
    year = _year(found["year"])
    if year is None:
        return f"has year {found['year'][:20]} (four digits, 1900 or later)"
    day, number = found["day"], _MONTHS.index(month.lower()) + 1
    days = _days_in(year, number)
    if len(day) > 2 or not 1 <= int(day) <= days:
        return f"has day {day[:20]} ({_MONTH_NAMES[number - 1]} {year} has {days} days)"
    for name, digits, top in (
        ("hour", found["hour"], 23),
        ("minute", found["minute"], 59),
        ("second", found["second"], 60),
    ):
        if digits is not None and (len(digits) != 2 or int(digits) > top):
            return f"has {name} {digits[:20]} (two digits, 00 to {top})"
    zone = found["zone"]
    if zone is None:
        return f"has no time zone ({_ZONE_FORM})"
    if zone[0] in "+-" and (len(zone) != 5 or int(zone[1:3]) > 23 or int(zone[3:]) > 59):
        return f"has time zone {zone[:20]} ({_ZONE_FORM})"
    if zone[0] not in "+-" and (len(zone) > 5 or zone.lower() == "j"):
        return f'has time zone "{zone[:20]}" ({_ZONE_FORM})'
    if weekday is not None:
        actual = datetime.date(year, number, int(day)).weekday()
        if actual != _WEEKDAYS.index(weekday.lower()):
            date = f"{int(day)} {month.title()} {year}"
            return f'has "{weekday}" for the day of the week, but {date} is a {_DAY_NAMES[actual]}'
    return None


def _year(digits: str) -> int | None:
    """The year of 3.3 and 4.3, or None if there is none (one digit, before 1900, past 9999)."""
    if len(digits) == 2:
        return int(digits) + (2000 if int(digits) < 50 else 1900)
    if len(digits) == 3:
        return int(digits) + 1900
    year = int(digits) if 4 <= len(digits) <= 5 else 0
    return year if 1900 <= year <= 9999 else None


def _days_in(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _without_comments(value: str) -> str | None:
    """`value` with each comment (RFC 5322 3.2.2: nested parentheses, quoted pairs in them)
    made a space; None if one is not closed, or a ")" closes none."""
    if "(" not in value and ")" not in value:
        return value
    out: list[str] = []
    depth = 0
    escaped = False
    for char in value:
        if depth == 0:
            if char == "(":
                depth, char = 1, " "
            elif char == ")":
                return None
            out.append(char)
        elif escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
    return "".join(out) if depth == 0 else None


MESSAGE_ID_FORM: Final = '"<1234.5678@example.org>"'
"""A msg-id as RFC 5322 3.6.4 writes one, for what is said of one that is not."""
# atext (3.2.3), and UTF-8 beyond ASCII (RFC 6532 3.2), with the dots of a dot-atom.
_ID_TEXT: Final = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.\x80-\ud7ff\ue000-\U0010ffff-]+")
_BLANKS_OR_NOTHING: Final = re.compile(r"[ \t]*")


def message_id_problem(value: str) -> str | None:
    """What is wrong with a Message-ID field's value (unfolded) as an RFC 5322 3.6.4 msg-id,
    said of the value ("is not in angle brackets"), or None if it is one.

    A msg-id is "<" id-left "@" id-right ">", with white space and comments around it. Each
    side is lenient where mailers are: a quoted string in the left part (the obsolete forms),
    a domain literal ("[192.0.2.1]") for the right, UTF-8 (RFC 6532). Not one: what has no
    angle brackets, no "@", nothing on a side of it, white space (or a comment) inside the
    brackets, a second "@", more than one msg-id, a dot that is not between two other
    characters (`<a..b@c>`, `<a.@b>`, `<a@b.>`: each side is a dot-atom-text, or a quoted
    string or domain literal, and not even the obsolete forms have an empty word)."""
    text = _without_comments(value)
    if text is None:
        return f"is not of the form {MESSAGE_ID_FORM}: a comment's parentheses do not match"
    text = text.strip(" \t")
    if not text:
        return "is empty"
    if not text.startswith("<"):
        where = 'has text before its "<"' if "<" in text else "is not in angle brackets"
        return f"{where} (the form is {MESSAGE_ID_FORM})"
    at = 1
    left, at, left_dots = _id_part(text, at, quote='"')
    if isinstance(left, str):
        return left
    if text.startswith(">", at) or at == len(text):
        return f'has no "@" (the form is {MESSAGE_ID_FORM})'
    if not text.startswith("@", at):
        return _unexpected(text, at)
    if not left:
        return 'has nothing before its "@"'
    right, at, right_dots = _id_part(text, at + 1, quote="[")
    if isinstance(right, str):
        return right
    if not right:
        return 'has nothing after its "@"' if at == len(text) or text[at] == ">" else _unexpected(text, at)
    if at == len(text):
        return 'has no closing ">"'
    if not text.startswith(">", at):
        return _unexpected(text, at)
    if at + 1 != len(text):
        return 'has more after its ">" (one msg-id only)'
    if left_dots is not None:
        return f"has {_LEFT_DOTS[left_dots]} {_DOTS}"
    if right_dots is not None:
        return f"has {_RIGHT_DOTS[right_dots]} {_DOTS}"
    return None


# A dot out of place in a side of a msg-id (`_id_part`), and what is said of one on each side.
_LEADING: Final = 0
_TRAILING: Final = 1
_DOUBLE: Final = 2
_LEFT_DOTS: Final = ('"." just after its "<"', '"." just before its "@"', '".." before its "@"')
_DOTS: Final = "(RFC 5322 3.6.4: a dot only between two other characters)"
_RIGHT_DOTS: Final = ('"." just after its "@"', '"." just before its ">"', '".." after its "@"')


def _id_part(text: str, at: int, quote: str) -> tuple[int | str, int, int | None]:
    """Read one side of a msg-id from `at`: its length (as an int) and where it ends, or the
    problem (a str); and its first dot out of place (`_LEADING`, ...), if any. `quote` opens
    what the side may hold: a quoted string on the left, a domain literal on the right."""
    start = at
    dots: int | None = None
    while at < len(text):
        if (found := _ID_TEXT.match(text, at)) is not None:
            if dots is None:  # (after a quoted string, a dot starts the next word: `"a".b`)
                dots = _LEADING if at == start and text[at] == "." else _DOUBLE if ".." in found[0] else None
            at = found.end()
        elif text[at] == quote:
            end = _quoted_end(text, at, '"' if quote == '"' else "]")
            if end == _BLANK:
                return "has white space inside its angle brackets", at, None
            if end < 0:
                what = "quoted string" if quote == '"' else "domain literal"
                return f"has a {what} that does not end", at, None
            at = end
        else:
            break
    if dots is None and at > start and text[at - 1] == ".":
        dots = _TRAILING
    return at - start, at, dots


_BLANK: Final = -2


def _quoted_end(text: str, at: int, close: str) -> int:
    """Where the quoted string or domain literal opening at `at` ends (after `close`): -1 if
    it does not (a "[" in a literal), `_BLANK` at white space in it; a backslash quotes the
    next character."""
    at += 1
    while at < len(text):
        char = text[at]
        if char == close:
            return at + 1
        if char in " \t":
            return _BLANK
        if close == "]" and char == "[":
            return -1
        at += 2 if char == "\\" else 1
    return -1


def _unexpected(text: str, at: int) -> str:
    char = text[at]
    if char in " \t":
        return "has white space inside its angle brackets"
    if char == "@":
        return 'has more than one "@"'
    mark = "'" if char == '"' else '"'
    return f"has {mark}{shown(char)}{mark} inside its angle brackets, where RFC 5322 3.6.4 allows none"


class Malformed(NamedTuple):
    """A Date or Message-ID field whose value is not of its RFC 5322 syntax."""

    name: str
    value: str
    """Its value, unfolded, with its octets that are not UTF-8 as surrogate escapes."""
    problem: str
    """What is wrong with it (`date_problem`, `message_id_problem`)."""


_CHECKED: Final = ((b"date", "Date", date_problem), (b"message-id", "Message-ID", message_id_problem))


def malformed_field(
    head: bytes, lowered: bytes, *, cut: bool = False, late: dict[bytes, LateField] | None = None
) -> Malformed | None:
    """The first of the header section's Date and Message-ID fields (`head` from a leading LF,
    `lowered` the same lowered) that is not of its syntax, or None. Only the first field of
    each name is read: a second is refused as such (`repeated_field`). `cut`: `head` is the
    kept part of a longer header section, so a field that reaches its end may go on past it,
    and is read from `late` (`HeaderSection.late_checked`), as one wholly past it is."""
    for key, name, problem_of in _CHECKED:
        found = _first_value(head, lowered, key, cut, late)
        if found is None:
            continue
        value, whole = found
        text = value.decode("utf-8", "surrogateescape")
        if not whole:  # (over `KEPT`: what is past it is not read, and no date or msg-id is so long)
            return Malformed(name, text, f"is over {KEPT // 1024} KiB long")
        if (problem := problem_of(text)) is not None:
            return Malformed(name, text, problem)
    return None


def author_missing(
    head: bytes, lowered: bytes, *, cut: bool = False, late: dict[bytes, LateField] | None = None
) -> bool:
    """Whether the header section (as `malformed_field` reads it) names no author: it has no
    From field, or its first has nothing but white space (RFC 5322 3.6.2: a From holds at least
    one mailbox)."""
    found = _first_value(head, lowered, b"from", cut, late)
    return found is None or not found[0].strip(b" \t")


def author_missing_in(message: bytes) -> bool:
    """`author_missing` of a whole message held in memory (CRLF line endings)."""
    end = message.find(b"\r\n\r\n")
    head = b"\n" + (message if end < 0 else message[: end + 2])
    return author_missing(head, head.lower())


def _first_value(
    head: bytes, lowered: bytes, name: bytes, cut: bool, late: dict[bytes, LateField] | None
) -> tuple[bytes, bool] | None:
    """The value of the first field called `name` (one of `_CHECKED_NAMES`), unfolded (2.2.3),
    and whether it is whole (False: it runs past the `KEPT` bytes kept of it); None if there
    is none. Read from `head` (see `malformed_field`), or else from `late`."""
    # (One regex search, which costs less than a `bytes.find` of b"\ndate" would: 2.5 us over
    # a usual 5 KiB header section against 6.)
    field = _CHECKED_FIELDS[name].search(lowered)
    if field is not None:
        end = _value_end(head, field.end())
        if not (cut and (end < 0 or end + 2 >= len(head))):
            return head[field.end() : end if end >= 0 else len(head)].replace(b"\r\n", b""), True
    kept = late.get(name) if late else None
    if kept is None:
        return None
    text = b"\n" + bytes(kept.text)
    field = _CHECKED_FIELDS[name].match(text.lower())
    if field is None:  # (it is one: it was found so)
        return None
    end = _value_end(text, field.end())
    value = text[field.end() : end if end >= 0 else len(text)].replace(b"\r\n", b"")
    return value, len(kept.text) < KEPT


def malformed_field_in(message: bytes) -> Malformed | None:
    """`malformed_field` of a whole message held in memory (CRLF line endings)."""
    end = message.find(b"\r\n\r\n")
    head = b"\n" + (message if end < 0 else message[: end + 2])
    return malformed_field(head, head.lower())


def _value_end(head: bytes, start: int) -> int:
    """Where the field whose value starts at `start` ends (at the CRLF that no white space
    follows: RFC 5322 2.2.3), or -1 if it runs to the end of `head`."""
    end = head.find(b"\r\n", start)
    while end >= 0 and head[end + 2 : end + 3] in (b" ", b"\t"):
        end = head.find(b"\r\n", end + 2)
    return end
