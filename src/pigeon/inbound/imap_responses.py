"""IMAP responses from the server's bytes, without I/O: whole responses, and FETCH data read.

`ResponseReader` cuts the server's byte stream into responses. A response is a line, which may
carry literals: a line part ending in "{n}" is followed by n bytes of data, then by the rest of
the line (RFC 3501 4.3 and 7). Bytes go in with `receive_data` as the socket cuts them, and
`next_response` hands out each response once it is whole (None: more bytes are needed), its
literals as they came: nothing is escaped or scanned inside them.

`canonical` puts a response's names in capitals (servers may send them in any case),
`capability_names` reads a CAPABILITY response, and `esearch_uids` the ESEARCH response an
IMAP4rev2 server answers UID SEARCH with.

`fetch_data` reads a "* n FETCH (...)" response's data items: UID, FLAGS, RFC822.SIZE and the
body (BODY[], BODY.PEEK[]'s answer, or RFC822), each None when the server did not send it.
Other items (MODSEQ, Gmail's X-GM-LABELS, ENVELOPE...) are read and left out.

Why not aioimaplib's parser: it handles a response line by line, each through several regular
expressions and a command's bookkeeping, and its FETCH answers come back as a flat list of
lines and literals for the caller to read again. Draining a backlog, that was the busiest
part of the event loop (a third of its time with a Maildir target, more than hashing,
writing and acknowledging). `imap._Protocol` gives the FETCH responses of Pigeon's own
FETCH commands to `fetch_data` and every other response to aioimaplib, whole.

A server that breaks the grammar (a FETCH whose items cannot be read, a literal too long to
be one) raises `MalformedResponse`: the caller closes the connection, as on any broken peer.
"""

from __future__ import annotations

import itertools
import re
from typing import Final, NamedTuple

_CRLF: Final = b"\r\n"
_MAX_LITERAL_DIGITS: Final = 18  # "{n}" with more digits is no literal any server sends (an exabyte)
# Response names, item names and other atoms are case-insensitive (RFC 3501 9, RFC 9051 9):
# "* 1 fetch (uid 1 ...)" is a FETCH response, and was dropped unread as none.
_FETCH: Final = re.compile(rb"\* (\d+) FETCH \(", re.IGNORECASE)
_FETCH_NAME: Final = re.compile(rb"\* \d+ FETCH\b", re.IGNORECASE)  # what aioimaplib would take for one (then give us)
# One token of a FETCH response's item list, after any spaces: an atom (a number, NIL, a flag
# such as "\Seen" or "\*", or an item name, whose [section] may hold spaces and parentheses:
# "BODY[HEADER.FIELDS (FROM)]<0>"), a parenthesis, a quoted string, or a literal's "{n}" (or a
# literal8's "~{n}", RFC 3516), which ends its text part.
_TOKEN: Final = re.compile(
    rb' *(?:(?P<atom>(?!~\{)[^ ()"{}\[\]\r\n]+(?:\[[^\]\r\n]*\](?:<\d+>)?)?)'
    rb'|(?P<open>\()|(?P<close>\))|"(?P<quoted>(?:[^"\\\r\n]|\\.)*)"|(?P<literal>~?\{\d+\}))'
)
# The usual FETCH response, read by two regular expressions: items whose values are numbers
# or lists of flags, then the list's end or the body's literal (`_values` reads any other).
_FLAT_ITEMS: Final = rb"\* (\d+) FETCH \(((?:[A-Z0-9.]+ (?:\d+|\([^()\"{}\[\]\r\n]*\)) ?)*)"
_FLAT: Final = re.compile(_FLAT_ITEMS + rb"(?:(BODY\[\]|RFC822) \{\d{1,18}\}|\))$", re.IGNORECASE)
_FLAT_AT: Final = re.compile(_FLAT_ITEMS + rb"(?:(BODY\[\]|RFC822) \{(\d{1,18})\}\r\n|\)\r\n)", re.IGNORECASE)
_PAIR: Final = re.compile(rb"([A-Z0-9.]+) (\d+|\([^)]*\))", re.IGNORECASE)
_PARTIAL: Final = re.compile(rb"<\d+>$")  # "BODY[]<0>" answers for "BODY[]"
_ESCAPE: Final = re.compile(rb"\\(.)")
_BODY_NAMES: Final = frozenset({b"BODY[]", b"BINARY[]", b"RFC822"})  # BODY.PEEK[] is answered as BODY[]


class MalformedResponse(ValueError):
    """The server's bytes are not an IMAP response Pigeon can read."""


class Response(NamedTuple):
    """One response: `text` the line's parts, `literals` the data between them (one fewer;
    each text part but the last ends with the "{n}" that announced the literal after it)."""

    text: tuple[bytes, ...]
    literals: tuple[bytes, ...]

    def raw(self) -> bytes:
        """The response as the server sent it."""
        if not self.literals:
            return self.text[0] + _CRLF
        parts = [
            piece for text, literal in zip(self.text, self.literals, strict=False) for piece in (text, _CRLF, literal)
        ]
        return b"".join([*parts, self.text[-1], _CRLF])

    @property
    def is_fetch(self) -> bool:
        """Whether it is an untagged FETCH response (then `fetch_data` reads it)."""
        return _FETCH_NAME.match(self.text[0]) is not None


class FetchData(NamedTuple):
    """A FETCH response's items: those the server did not send are None. (A named tuple, as
    `Response`: a backlog makes thousands a second, and a frozen dataclass is slower to make.)"""

    number: int  # the message's sequence number
    uid: int | None = None
    flags: tuple[str, ...] | None = None
    size: int | None = None  # RFC822.SIZE
    body: bytes | None = None


class ResponseReader:
    """The server's byte stream, cut into whole responses."""

    def __init__(self) -> None:
        self._buffer = b""
        self._cursor = 0  # where the current response's next text part starts
        self._search = 0  # where to look for its line end from (what came before has none)
        self._text: list[bytes] = []  # the current response's parts read so far
        self._literals: list[bytes] = []
        self._literal = -1  # the size of the literal at `_cursor`, still to come; -1: none
        self._pieces: list[bytes] = []  # the literal's bytes that came before `_cursor`

    def receive_data(self, data: bytes) -> None:
        """Take bytes as they came from the server."""
        # What was read is copied out already: the buffer keeps the rest (one response at
        # most, not yet whole), and the new bytes. A copy per chunk, and a literal is then one
        # slice of it (a bytearray would take two copies: its slice, then bytes of that).
        self._buffer = self._buffer[self._cursor :] + data if self._cursor < len(self._buffer) else data
        self._search -= self._cursor
        self._cursor = 0

    def next_event(self, *, fetch: bool) -> Response | FetchData | None:
        """`next_response`, or with `fetch` an untagged FETCH response read (`fetch_data`)."""
        if fetch and not self._text and self._literal < 0:
            flat = _FLAT_AT.match(self._buffer, self._cursor)
            if flat is not None:
                item = self._flat(flat)
                if item is not None:
                    return item
        response = self.next_response()
        if response is None or not fetch or not response.is_fetch:
            return response
        return fetch_data(response)

    def _flat(self, flat: re.Match[bytes]) -> FetchData | None:
        """The usual FETCH response (see `_FLAT_AT`), when whole in the buffer; else None,
        for `next_response` to read (whole or not)."""
        end = flat.end()
        body: bytes | None = None
        if flat.group(4) is not None:  # its body: a literal, then the list's ")"
            start, end = end, end + int(flat.group(4))
            if self._buffer[end : end + 3] != b")\r\n":
                return None  # not all here yet, or more items after the body
            body = self._buffer[start:end]
            end += 3
        item = _flat_items(int(flat.group(1)), flat.group(2), flat.group(3), body)
        self._cursor = self._search = end
        return item

    def next_response(self) -> Response | None:
        """The next whole response, or None until more bytes come."""
        buffer = self._buffer
        while True:
            if self._literal >= 0:
                end = self._cursor + self._literal
                if len(buffer) < end:
                    # Part of a literal: set aside, so a big one coming in many chunks is
                    # copied once, not once per chunk with all that came before it.
                    self._pieces.append(buffer[self._cursor :])
                    self._literal -= len(buffer) - self._cursor
                    self._cursor = self._search = len(buffer)
                    return None
                piece = buffer[self._cursor : end]
                self._literals.append(b"".join([*self._pieces, piece]) if self._pieces else piece)
                self._pieces = []
                self._cursor = self._search = end
                self._literal = -1
            start = self._cursor
            stop = buffer.find(_CRLF, self._search)
            if stop < 0:
                self._search = max(start, len(buffer) - 1)  # a CR at the end may start the CRLF
                return None
            part = buffer[start:stop]
            self._text.append(part)
            self._cursor = self._search = stop + 2
            size = _literal_size(part) if part[-1:] == b"}" else -1
            if size >= 0:
                self._literal = size
                continue
            response = Response(tuple(self._text), tuple(self._literals))
            self._text, self._literals = [], []
            return response


# The names at the start of a response: a tagged status ("a1 ok"), an untagged response's name
# ("* ok", "* capability", "* 3 exists"), and after a status its response code's ("[uidvalidity").
_NAMES: Final = re.compile(rb"(?:\* (?:\d+ )?|[^ \r\n*+]+ )([A-Za-z][A-Za-z0-9.-]*)(?: \[([A-Za-z][A-Za-z0-9.-]*))?")
_STATUSES: Final = frozenset({b"OK", b"NO", b"BAD", b"BYE", b"PREAUTH"})
_SEQUENCE_SET: Final = re.compile(rb"[1-9]\d{0,9}(?::[1-9]\d{0,9})?(?:,[1-9]\d{0,9}(?::[1-9]\d{0,9})?)*")
_ESEARCH_TOKEN: Final = re.compile(rb" *(?:\((?P<list>[^()]*)\)|(?P<atom>[^ ()]+))")
_CORRELATOR: Final = re.compile(rb'TAG "((?:[^"\\]|\\.)*)"', re.IGNORECASE)
MAX_SEARCH_UIDS: Final = 10_000_000
"""UIDs an ESEARCH answer may list (its ranges expanded): a server's "1:4294967295" for a folder of
five messages is refused rather than made into a list of four billion numbers."""


def canonical(response: bytes) -> bytes:
    """`response` with its names in capitals, the same length: its tagged status or untagged
    name ("a1 ok done" is "a1 OK done", "* 3 exists" is "* 3 EXISTS"), a status's response code
    ("* ok [uidvalidity 7]" has "[UIDVALIDITY 7]"), and the capabilities a CAPABILITY response or
    response code lists. Text, flags and data are left as they came.

    Names are case-insensitive (RFC 3501 9, RFC 9051 9), and aioimaplib (and Pigeon's own
    matching) compare them in capitals: a server that answered in lower case had its tagged
    "ok" taken for no answer, and its capabilities for none."""
    match = _NAMES.match(response)
    if match is None:
        return response
    name = match.group(1).upper()
    spans = [match.span(1)]
    line_end = response.find(_CRLF)
    line_end = len(response) if line_end < 0 else line_end
    if name == b"CAPABILITY":
        spans.append((match.end(1), line_end))
    elif name in _STATUSES and match.group(2) is not None:
        code = match.group(2).upper()
        if code == b"CAPABILITY":
            closing = response.find(b"]", match.end(2), line_end)
            spans.append((match.start(2), closing if closing >= 0 else line_end))
        else:
            spans.append(match.span(2))
    out = bytearray(response)
    for start, end in spans:
        out[start:end] = response[start:end].upper()
    return bytes(out)


def capability_names(words: bytes) -> frozenset[str]:
    """The capabilities a CAPABILITY response lists (`words`: what follows its name), in capitals:
    they are case-insensitive ("idle" is IDLE)."""
    return frozenset(word.upper() for word in words.decode("ascii", "replace").split())


def esearch_uids(response: bytes, tag: str) -> list[int] | None:
    """The UIDs an ESEARCH response lists, sorted (`response` without its "* ": "ESEARCH (TAG
    "A1") UID ALL 2,10:11" is [2, 10, 11]; one without ALL found none). None when its tag
    correlator names another command than `tag`. IMAP4rev2 servers answer every SEARCH so
    (RFC 9051 7.1, RFC 4731). Raises `MalformedResponse`."""
    words = response.split(b" ", 1)
    if words[0].upper() != b"ESEARCH":
        raise MalformedResponse(f"not an ESEARCH response: {response[:80]!r}")
    rest = words[1] if len(words) > 1 else b""
    tokens: list[tuple[str, bytes]] = []
    position = 0
    while position < len(rest.rstrip(b" ")):
        token = _ESEARCH_TOKEN.match(rest, position)
        if token is None or token.end() == position:
            raise MalformedResponse(f"cannot read an ESEARCH response at {rest[position:][:40]!r}")
        position = token.end()
        kind = token.lastgroup or "atom"
        tokens.append((kind, token.group(kind)))
    if tokens and tokens[0][0] == "list":
        correlator = _CORRELATOR.search(tokens.pop(0)[1])
        if correlator is not None and correlator.group(1).decode("ascii", "replace") != tag:
            return None
    if tokens and tokens[0][0] == "atom" and tokens[0][1].upper() == b"UID":
        tokens.pop(0)
    if len(tokens) % 2:
        raise MalformedResponse(f"an ESEARCH result without its value: {response[:80]!r}")
    found: list[int] = []
    for (_, name), (kind, value) in zip(tokens[0::2], tokens[1::2], strict=True):
        if name.upper() != b"ALL":
            continue  # MIN, MAX, COUNT (asked for with RETURN, which Pigeon does not)
        if kind != "atom" or not _SEQUENCE_SET.fullmatch(value):
            raise MalformedResponse(f"an ESEARCH ALL that is no set of UIDs: {value[:40]!r}")
        found = _expand(value)
    return found


def _expand(sequence_set: bytes) -> list[int]:
    """ "2,10:11" as [2, 10, 11] (sorted, once each): at most `MAX_SEARCH_UIDS`."""
    uids: list[int] = []
    for part in sequence_set.split(b","):
        low, _, high = part.partition(b":")
        first, last = sorted((int(low), int(high or low)))
        if len(uids) + last - first + 1 > MAX_SEARCH_UIDS:
            raise MalformedResponse(f"an ESEARCH answer of more than {MAX_SEARCH_UIDS} UIDs")
        uids += range(first, last + 1)
    # Servers list them in order; a set is made only for one that does not.
    if any(a >= b for a, b in itertools.pairwise(uids)):
        uids = sorted(set(uids))
    return uids


def _literal_size(part: bytes) -> int:
    """n when the line part ends with "{n}" (a literal follows), else -1."""
    if not part.endswith(b"}"):
        return -1
    opening = part.rfind(b"{")
    digits = part[opening + 1 : -1]
    if opening < 0 or not digits.isdigit():
        return -1
    if len(digits) > _MAX_LITERAL_DIGITS:
        raise MalformedResponse(f"a literal of {len(digits)} digits")
    return int(digits)


def fetch_data(response: Response) -> FetchData | None:
    """The items of an untagged FETCH response; None for any other response. Raises
    `MalformedResponse` when it is a FETCH whose items cannot be read."""
    text = response.text
    first = text[0]
    flat = _FLAT.match(first)
    if flat is not None and len(text) == (2 if flat.group(3) else 1) and (len(text) == 1 or text[1] == b")"):
        return _flat_items(
            int(flat.group(1)), flat.group(2), flat.group(3), response.literals[0] if flat.group(3) else None
        )
    match = _FETCH.match(first)
    if match is None:
        if response.is_fetch:
            raise MalformedResponse(f"a FETCH response without its item list: {first[:80]!r}")
        return None
    items = _values(response, match.end())
    if len(items) % 2:
        raise MalformedResponse(f"a FETCH item without its value: {first[:80]!r}")
    names = items[0::2]
    if not all(isinstance(name, bytes) for name in names):
        raise MalformedResponse(f"a FETCH item name that is not one: {first[:80]!r}")
    pairs = [(_PARTIAL.sub(b"", name.upper()), value) for name, value in zip(names, items[1::2], strict=True)]  # type: ignore[union-attr]
    return _fetch_items(int(match.group(1)), pairs)


def _flat_items(number: int, items: bytes, body_name: bytes | None, body: bytes | None) -> FetchData:
    """`FetchData` from the usual FETCH response's items (`_FLAT_ITEMS`: numbers and flag
    lists), and its body."""
    uid: int | None = None
    flags: tuple[str, ...] | None = None
    size: int | None = None
    for name, value in _PAIR.findall(items):
        name = name.upper()
        if name == b"FLAGS":
            flags = tuple(value[1:-1].decode("utf-8", "replace").split())
        elif name == b"UID":
            uid = _number(name, value)
        elif name == b"RFC822.SIZE":
            size = _number(name, value)
    return FetchData(number, uid, flags, size, body if body_name is not None else None)


def _fetch_items(number: int, pairs: list[tuple[bytes, _Value]]) -> FetchData:
    """`FetchData` from a FETCH response's (name, value) pairs (names in capitals)."""
    uid: int | None = None
    flags: tuple[str, ...] | None = None
    size: int | None = None
    body: bytes | None = None
    for name, value in pairs:
        if name == b"UID":
            uid = _number(name, value)
        elif name == b"FLAGS":
            if not isinstance(value, list) or not all(isinstance(flag, bytes) for flag in value):
                raise MalformedResponse(f"FLAGS is not a list of flags: {value!r:.80}")
            flags = tuple(flag.decode("utf-8", "replace") for flag in value if isinstance(flag, bytes))
        elif name == b"RFC822.SIZE":
            size = _number(name, value)
        elif name in _BODY_NAMES:
            if isinstance(value, list):
                raise MalformedResponse(f"{name.decode('ascii', 'replace')} is not a string")
            body = value if value is not None else b""
    return FetchData(number, uid, flags, size, body)


def _number(name: bytes, value: _Value) -> int:
    if not isinstance(value, bytes) or not value.isdigit():
        raise MalformedResponse(f"{name.decode('ascii', 'replace')} is not a number: {value!r:.80}")
    return int(value)


_Value = bytes | list["_Value"] | None  # a string (atoms too), a parenthesized list, or NIL


def _values(response: Response, position: int) -> list[_Value]:
    """The values of the list that starts at `position` of the response's first text part
    (just past its "("), up to its ")", which must end the response: atoms (item names, numbers,
    flags) and strings as bytes, NIL as None, lists as lists. One regular expression finds
    each token, and a stack keeps the lists open around it."""
    top: list[_Value] = []
    current = top
    outer: list[list[_Value]] = []  # the lists `current` is inside
    last = len(response.text) - 1
    for part, text in enumerate(response.text):
        end = len(text)
        while position < end:
            match = _TOKEN.match(text, position)
            if match is None:
                raise MalformedResponse(f"cannot read a FETCH response at {text[position:][:40]!r}")
            position = match.end()
            kind = match.lastgroup
            if kind == "atom":
                atom = match.group("atom")
                current.append(None if atom.upper() == b"NIL" else atom)
            elif kind == "open":
                inner: list[_Value] = []
                current.append(inner)
                outer.append(current)
                current = inner
            elif kind == "close":
                if not outer:  # the item list's own ")": the end of the response
                    if part != last or text[position:].strip(b" "):
                        raise MalformedResponse("more after a FETCH response's item list")
                    return top
                current = outer.pop()
            elif kind == "quoted":
                current.append(_ESCAPE.sub(rb"\1", match.group("quoted")))
            elif part < last and position == end:  # "{n}": the literal that follows this part
                current.append(response.literals[part])
            else:
                raise MalformedResponse(f"a literal that is not one: {text[match.start() :][:40]!r}")
        position = 0
    raise MalformedResponse("a FETCH response whose item list does not end")
