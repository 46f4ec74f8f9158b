"""A password kept in a file of its own, rather than in the config: its first line.

Read the same way wherever the config names one (`[[mailbox]] password_file`, `[[route]]
auth_password_file`): the first line, without its line end or the white space around it, so
that a file written by `echo` or an editor (a trailing newline) holds the same password as one
written without, and without the UTF-8 byte order mark some editors put first. Empty when the
file is.
"""

from __future__ import annotations

import codecs
from pathlib import Path


def first_line(path: Path) -> str:
    """The secret in `path` (raises OSError when it cannot be read, UnicodeDecodeError when its
    first line is not UTF-8 text)."""
    # Bytes, not read_text(): its universal newlines end a line at a lone CR too, and cut a
    # password holding one short. Lines end at LF (or CRLF) alone: not str.splitlines()
    # either, which also ends one at \v, \f, \x1c-\x1e, \x85, U+2028 and U+2029. Likewise
    # only spaces and tabs around it are dropped.
    data = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    line = data.split(b"\n", 1)[0].removesuffix(b"\r")
    return line.decode("utf-8").strip(" \t")
