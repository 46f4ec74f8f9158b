"""A password kept in a file of its own, rather than in the config: its first line.

Read the same way wherever the config names one (`[[mailbox]] password_file`, `[[route]]
auth_password_file`): the first line, without its line end or the white space around it, so
that a file written by `echo` or an editor (a trailing newline) holds the same password as one
written without. Empty when the file is.
"""

from __future__ import annotations

from pathlib import Path


def first_line(path: Path) -> str:
    """The secret in `path` (raises OSError when it cannot be read, UnicodeDecodeError when it
    is not UTF-8 text)."""
    # Lines end at LF (or CRLF) alone: not str.splitlines(), which also ends one at \v, \f,
    # \x1c-\x1e, \x85, U+2028 and U+2029, and so cut a password holding one of them short.
    # Likewise only spaces and tabs around it are dropped.
    line = path.read_text().split("\n", 1)[0].removesuffix("\r")
    return line.strip(" \t")
