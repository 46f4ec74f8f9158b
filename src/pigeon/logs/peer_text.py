r"""Text someone else chose, made safe to show: printable, unambiguous and bounded.

A refused command's argument (the recipient of a refused RCPT) is whatever the client chose
to send, and a remote server's reply whatever that server chose to answer; an operator reads
them in a terminal or a log viewer (`pigeon inspect`, `queue summary`, `top`, ...), a sender in
a DSN. This is the one escaping function for all of them. JSON escapes only C0
controls, so DEL, C1 controls (U+009B is a terminal's CSI), bidirectional overrides and bytes
that are not UTF-8 would reach the screen as they are. `shown()` keeps every printable
character (UTF-8 letters included) and writes each other one, and the backslash itself, as a
Python escape (`\x1b`, `\u009b`, `\u202e`, `\\`), so no two different inputs look the same.
Input decoded with errors="surrogateescape" gets its undecodable bytes back as `\xHH`
(`\xHH` is only ever a byte from 0x80 or an ASCII control, never a character of U+0080 on).

Past `limit` characters of output the text is cut (never inside an escape) and "..." is
added: a client's address that long is no address anyway (RFC 5321 4.5.3.1.3). A limit of
None cuts nothing (a reply, a reason: bounded where they came in).

`escape_unprintable()` escapes the same way but cuts nothing and leaves the backslash alone:
the daemon's log formatter runs it over every whole line, text already `shown` included.
"""

from __future__ import annotations

from typing import Final

ADDRESS_LIMIT: Final = 256
"""RFC 5321 4.5.3.1.3: a path is at most 256 octets; what is longer is not an address."""


def shown(text: str, limit: int | None = ADDRESS_LIMIT) -> str:
    """`text` with every non-printable character escaped, at most `limit` characters (+ "...")."""
    if (limit is None or len(text) <= limit) and text.isprintable() and "\\" not in text:
        return text  # the common case: an ordinary address, nothing to do
    out: list[str] = []
    size = 0
    for char in text:
        piece = char if char.isprintable() and char != "\\" else _escape(char)
        if limit is not None and size + len(piece) > limit:
            out.append("...")
            break
        out.append(piece)
        size += len(piece)
    return "".join(out)


def shown_value(value: str) -> str:
    """A header field's value as a reply shows it: one line, white space runs made one space,
    escaped (`shown`; beyond ASCII too: the client may not have said SMTPUTF8), at most 80
    characters."""
    return shown(" ".join(value.split()), 80).encode("ascii", "backslashreplace").decode("ascii")


def escape_unprintable(text: str, keep: str = "") -> str:
    """`text` with every character that is not printable, but those in `keep`, escaped as
    `shown` escapes it; nothing cut, and the backslash left as it is. For a whole line of the
    daemon's log, where text from others (a reply, an admin's reason) sits among ours: one
    already `shown` comes out as it went in, rather than with its escapes escaped again."""
    if text.isprintable():
        return text  # the common case, checked in C
    table = _TABLES.get(keep)
    if table is None:
        table = _TABLES[keep] = _EscapeTable(keep)
    # str.translate looks each character up in C: a megabyte of controls in tens of
    # milliseconds, where a Python loop over it took a second.
    return text.translate(table)


class _EscapeTable(dict[int, str]):
    """A translation table that works out each character's escape when first seen, and keeps
    it: what a line holds is a few distinct characters, however long it is."""

    def __init__(self, keep: str) -> None:
        super().__init__()
        self._keep = keep

    def __missing__(self, code: int) -> str:
        if len(self) >= _TABLE_LIMIT:
            self.clear()  # text made of every character there is: bounded memory, slower
        char = chr(code)
        self[code] = piece = char if char.isprintable() or char in self._keep else _escape(char)
        return piece


_TABLE_LIMIT: Final = 16384
_TABLES: dict[str, _EscapeTable] = {}


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for the byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    if char == "\\":
        return "\\\\"
    if code < 0x80:  # a character from 0x80 on is \u00HH: \xHH there is a byte that was not UTF-8
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
