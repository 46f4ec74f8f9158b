"""Folder names as IMAP spells them: modified UTF-7 (RFC 3501 5.1.3).

A mailbox name on the wire is 7-bit: printable ASCII stands for itself, except "&", written
"&-"; any other run of characters is "&", their UTF-16BE code units in base64 (with "," for
"/", no "=" padding), and "-". So "Entrée/Reçus" is "Entr&AOk-e/Re&AOc-us", and a server
given the UTF-8 bytes instead selects no folder, or another one.

Config names folders as people read them (`folder = "Entrée/Reçus"`); `to_imap` turns such
a name into the wire form. A name already in the wire form (as another tool showed it, say
"Entr&AOk-e") is sent as it is, so configs written that way keep working: a name that is
valid modified UTF-7 and ASCII is taken for one. Pure functions, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Final

_DIRECT: Final = re.compile(r"[\x20-\x25\x27-\x7e]+")  # printable ASCII but "&": as it is
_SHIFTED: Final = re.compile(r"&([A-Za-z0-9+,]*)-")


def encode(name: str) -> str:
    """`name` in modified UTF-7. Raises ValueError for a lone surrogate, which UTF-16 cannot
    carry (no folder has one)."""
    out: list[str] = []
    position = 0
    while position < len(name):
        direct = _DIRECT.match(name, position)
        if direct:
            out.append(direct.group())
            position = direct.end()
            continue
        if name[position] == "&":
            out.append("&-")
            position += 1
            continue
        end = position
        while end < len(name) and not ("\x20" <= name[end] <= "\x7e"):
            end += 1
        try:
            units = name[position:end].encode("utf-16-be")
        except UnicodeEncodeError as error:
            raise ValueError(f"{name!r}: not a folder name (a lone surrogate)") from error
        out.append("&" + base64.b64encode(units).decode("ascii").rstrip("=").replace("/", ",") + "-")
        position = end
    return "".join(out)


def decode(wire: str) -> str:
    """A modified UTF-7 name as text. Raises ValueError for one that is not valid modified
    UTF-7 (a "&" left open, bytes that are not UTF-16, characters that must be shifted)."""
    out: list[str] = []
    position = 0
    while position < len(wire):
        direct = _DIRECT.match(wire, position)
        if direct:
            out.append(direct.group())
            position = direct.end()
            continue
        shifted = _SHIFTED.match(wire, position)
        if shifted is None:
            raise ValueError(f"{wire!r}: not modified UTF-7 at offset {position}")
        data = shifted.group(1)
        position = shifted.end()
        if not data:
            out.append("&")
            continue
        # RFC 3501: a shifted run encodes no printable ASCII and is never empty of characters.
        if len(data) % 4 == 1:
            raise ValueError(f"{wire!r}: not modified UTF-7 at offset {shifted.start()} (a base64 run cut short)")
        try:
            units = base64.b64decode(data.replace(",", "/") + "=" * (-len(data) % 4), validate=True)
            text = units.decode("utf-16-be")
        except (binascii.Error, UnicodeDecodeError) as error:
            raise ValueError(f"{wire!r}: not modified UTF-7 at offset {shifted.start()}: {error}") from error
        if any("\x20" <= char <= "\x7e" for char in text):
            raise ValueError(f"{wire!r}: not modified UTF-7 at offset {shifted.start()} (printable ASCII shifted)")
        out.append(text)
    return "".join(out)


def to_imap(name: str) -> str:
    """A configured folder name as IMAP commands send it: encoded, unless it is in modified
    UTF-7 already (ASCII, valid, and what encoding its text gives: see the module)."""
    if name.isascii():
        try:
            if encode(decode(name)) == name:
                return name
        except ValueError:
            pass
    return encode(name)
