"""XOAUTH2 pieces without I/O: whether a token can be sent at all, and what a server's refusal
of one says.

A token is sent in the SASL string "user=...^Aauth=Bearer <token>^A^A", base64-encoded: one that
is empty (a password_file not written yet, or emptied) would be sent as a token all the same, and
one with a character that is not ASCII cannot be sent at all (aioimaplib raised a bare
UnicodeEncodeError). Both are refused before the connection, saying so.

A server refuses a token with a challenge, "+ <base64 of JSON>" ({"status":"401","schemes":
"bearer","scope":"mail"}: Google's and Dovecot's, RFC 7628 3.2.2), then NO once the client
answers it: `refusal` reads the challenge, so that the error says the token was refused, not
that a password was wrong.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Final

_SAID: Final = ("status", "scope")  # what a refusal's JSON says that helps (its "schemes" is always bearer)
_MAX_SHOWN: Final = 200  # characters of a challenge that is not the usual JSON


def token_problem(token: str) -> str | None:
    """Why `token` cannot be sent as an OAuth2 access token; None when it can. The token's
    characters are not shown (it is a secret), only where the first wrong one is."""
    if not token:
        return "the token is empty"
    for position, char in enumerate(token, start=1):
        if not (" " < char < "\x7f"):
            what = "a character that is not ASCII" if not char.isascii() else "white space or a control character"
            return f"the token holds {what} (at position {position} of {len(token)}): an OAuth2 access token is ASCII"
    return None


def refusal(challenge: bytes | None) -> str:
    """What a server's XOAUTH2 error challenge (the "+ ..." line) says, for an error message:
    "status 401, scope mail" from the usual JSON; the challenge's text (printable, cut short)
    otherwise; "" when there was none."""
    if not challenge:
        return ""
    text = challenge.removeprefix(b"+").strip()
    try:
        decoded = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        decoded = text
    try:
        data = json.loads(decoded)
    except ValueError:
        data = None
    if isinstance(data, dict):
        said = [f"{key} {value}" for key in _SAID if isinstance(value := data.get(key), str | int) and str(value)]
        if said:
            return _printable(", ".join(said))
    return _printable(decoded.decode("utf-8", "replace"))


def _printable(text: str) -> str:
    shown = "".join(char if char.isprintable() else "?" for char in text)
    return shown if len(shown) <= _MAX_SHOWN else shown[:_MAX_SHOWN] + "..."
