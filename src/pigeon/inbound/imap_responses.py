"""IMAP responses from the server's bytes, without I/O: whole responses, and FETCH data read.

`ResponseReader` cuts the server's byte stream into responses. A response is a line, which may
carry literals: a line part ending in "{n}" is followed by n bytes of data, then by the rest of
the line (RFC 3501 4.3 and 7). Bytes go in with `receive_data` as the socket cuts them, and
`next_response` hands out each response once it is whole (None: more bytes are needed), its
literals as they came: nothing is escaped or scanned inside them.

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

import re
from typing import Final, NamedTuple

_CRLF: Final = b"\r\n"
_MAX_LITERAL_DIGITS: Final = 18  # "{n}" with more digits is no literal any server sends (an exabyte)
_FETCH: Final = re.compile(rb"\* (\d+) FETCH \(")
_FETCH_NAME: Final = re.compile(rb"\* \d+ FETCH\b")  # what aioimaplib would take for one (then give us)
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
_FLAT: Final = re.compile(_FLAT_ITEMS + rb"(?:(BODY\[\]|RFC822) \{\d{1,18}\}|\))$")
_FLAT_AT: Final = re.compile(_FLAT_ITEMS + rb"(?:(BODY\[\]|RFC822) \{(\d{1,18})\}\r\n|\)\r\n)")
_PAIR: Final = re.compile(rb"([A-Z0-9.]+) (\d+|\([^)]*\))")
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
