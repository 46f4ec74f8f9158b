"""SMTP AUTH as a client, sans-IO (RFC 4954): what to say, and what to answer a challenge.

A route that relays through a smart host (`[[route]] auth_username`) authenticates once per
connection, after the EHLO on TLS and before the first transaction. `Credentials` is what the
route gives; `Exchange` is one AUTH command and its challenges, driven by
`pigeon.smtp.client_session`:

    AUTH PLAIN <base64(\\0user\\0password)>        RFC 4616, with its initial response (RFC 4954 4)
    AUTH LOGIN, 334, <base64(user)>, 334, <base64(password)>   (the de facto LOGIN mechanism)

The mechanism is the first of the route's own list (`Credentials.mechanisms`, in order of
preference) that the server's EHLO offers. PLAIN comes first by default: one round trip.

The password never leaves this module but on the wire: `Credentials` hides it from `repr()`,
and nothing here puts it in an exception's text.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Final

from pigeon.smtp.client import ClientProtocolError
from pigeon.smtp.replies import Reply

__all__ = ["MECHANISMS", "Credentials", "Exchange", "credentials_problem"]

MECHANISMS: Final = ("PLAIN", "LOGIN")
"""The mechanisms Pigeon speaks as a client, best first (PLAIN: one round trip)."""


def credentials_problem(username: str, password: str) -> str | None:
    """Why a user name and password cannot be sent with AUTH PLAIN and LOGIN (None: they can).
    PLAIN separates them with NUL, and a line break in a user name shows in every record. The
    password's characters are not named (it is a secret), nor is the password itself."""
    if not username:
        return "the user name is empty"
    if any(not char.isprintable() for char in username):
        return "the user name holds a control character"
    if username != username.strip():
        return "the user name has white space before or after it"
    if not password:
        return "the password is empty"
    if "\0" in password or "\r" in password or "\n" in password:
        return "the password holds a line break or NUL, which AUTH PLAIN cannot send"
    return None


@dataclass(frozen=True, slots=True)
class Credentials:
    """Who a route authenticates as. `mechanisms`: those it may use, in order of preference.
    `plaintext`: AUTH may go on a connection without TLS (`allow_plaintext_auth`); otherwise a
    connection that is not on TLS never carries it. `route`: the `[[route]]` it belongs to,
    for the logs. The password is kept out of `repr()` (a log of a destination, say)."""

    username: str
    password: str = field(repr=False)
    mechanisms: tuple[str, ...] = MECHANISMS
    plaintext: bool = False
    route: str = ""

    def __post_init__(self) -> None:
        problem = credentials_problem(self.username, self.password)
        if problem is not None:
            raise ValueError(problem)
        unknown = [m for m in self.mechanisms if m not in MECHANISMS]
        if unknown or not self.mechanisms:
            raise ValueError(f"mechanisms must be some of {', '.join(MECHANISMS)}, not {self.mechanisms!r}")

    def choose(self, offered: tuple[str, ...]) -> str | None:
        """The mechanism to use with a server that offers `offered`; None if none will do."""
        for mechanism in self.mechanisms:
            if mechanism in offered:
                return mechanism
        return None


def _b64(data: bytes) -> bytes:
    return base64.b64encode(data)


class Exchange:
    """One AUTH command with `mechanism` and the answers to its 334 challenges. `start()` is
    the command; `answer(reply)` the response to a 334 (raises ClientProtocolError when the
    mechanism has nothing more to say: the server broke the exchange)."""

    __slots__ = ("_command", "_responses", "mechanism")

    def __init__(self, credentials: Credentials, mechanism: str) -> None:
        self.mechanism = mechanism
        user, password = credentials.username.encode(), credentials.password.encode()
        self._responses: list[bytes] = []
        if mechanism == "PLAIN":
            # RFC 4616 2: [authzid] NUL authcid NUL passwd; no authzid: act as who logs in.
            self._command = b"AUTH PLAIN " + _b64(b"\0" + user + b"\0" + password) + b"\r\n"
        elif mechanism == "LOGIN":
            # The server asks "Username:", then "Password:" (base64). The challenges' text is
            # not read: servers word them differently, and the order is the mechanism's.
            self._command = b"AUTH LOGIN\r\n"
            self._responses = [_b64(user) + b"\r\n", _b64(password) + b"\r\n"]
        else:
            raise ValueError(f"no such mechanism: {mechanism}")

    def start(self) -> bytes:
        return self._command

    def answer(self, reply: Reply) -> bytes:
        if not self._responses:
            raise ClientProtocolError(f"answered AUTH {self.mechanism} with {reply}, where no more challenge may come")
        return self._responses.pop(0)
