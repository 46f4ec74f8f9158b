"""SMTP AUTH users: a file of salted scrypt hashes, written by `pigeon passwd`.

One user per line, `name:$scrypt$n=16384,r=8,p=1$<salt>$<hash>` (salt and hash in base64);
blank lines and `#` comments are allowed. scrypt (RFC 7914, in the standard library) is
memory-hard, so a stolen file is expensive to attack. Checking a password takes tens of
milliseconds of CPU: the listener runs it in a thread, never on the event loop.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Final

_N: Final = 2**14
_R: Final = 8
_P: Final = 1
_DUMMY_SALT: Final = secrets.token_bytes(16)


class PasswordFileError(Exception):
    """The users file cannot be read or has a malformed line (the message names the line)."""


def hash_password(password: str, *, n: int = _N, r: int = _R, p: int = _P) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=32)
    return f"$scrypt$n={n},r={r},p={p}${_b64(salt)}${_b64(digest)}"


def verify_password(stored: str, password: str) -> bool:
    """Constant-time check of `password` against a `$scrypt$...` string."""
    parsed = _parse(stored)
    if parsed is None:
        return False
    n, r, p, salt, expected = parsed
    try:
        digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=len(expected))
    except (ValueError, MemoryError):
        return False
    return hmac.compare_digest(digest, expected)


def _parse(stored: str) -> tuple[int, int, int, bytes, bytes] | None:
    """The scrypt parameters, salt and hash of a `$scrypt$...` string, or None if malformed."""
    try:
        _, scheme, params, salt_text, hash_text = stored.split("$")
        values = dict(item.split("=", 1) for item in params.split(","))
        n, r, p = int(values["n"]), int(values["r"]), int(values["p"])
        salt, expected = _unb64(salt_text), _unb64(hash_text)
    except (ValueError, KeyError):
        return None
    # n must be a power of two above 1; 16..32 bytes of hash; sane cost limits.
    if (
        scheme != "scrypt"
        or n < 2
        or n & (n - 1)
        or not 1 <= r <= 64
        or not 1 <= p <= 16
        or not 16 <= len(expected) <= 64
    ):
        return None
    return n, r, p, salt, expected


class PasswordFile:
    """The users of one file, read once at start."""

    def __init__(self, entries: dict[str, str]) -> None:
        self._entries = entries

    @classmethod
    def load(cls, path: Path) -> PasswordFile:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise PasswordFileError(f"{path}: cannot read the users file: {error.strerror}") from None
        entries: dict[str, str] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, stored = line.partition(":")
            if not sep or not name or _parse(stored) is None:
                raise PasswordFileError(
                    f"{path}, line {number}: expected user:$scrypt$...; write entries with `pigeon passwd`"
                )
            entries[name] = stored
        return cls(entries)

    def __len__(self) -> int:
        return len(self._entries)

    def check(self, username: str, password: str) -> bool:
        """True if the user exists and the password matches. Slow: call it in a thread."""
        stored = self._entries.get(username)
        if stored is None:
            # Spend the same time as for a real user, so timing does not reveal names.
            hashlib.scrypt(password.encode("utf-8"), salt=_DUMMY_SALT, n=_N, r=_R, p=_P, dklen=32)
            return False
        return verify_password(stored, password)


def user_name_problem(username: str) -> str | None:
    """Why `username` cannot be in a users file (None: it can): one line `user:hash` each."""
    if not username or ":" in username or any(c.isspace() for c in username) or not username.isprintable():
        return "a user name must be non-empty, without ':', spaces or control characters"
    return None


def set_password(path: Path, username: str, password: str) -> bool:
    """Add or replace a user's entry, rewriting the file atomically with mode 0600; True if
    the file was created. A file that exists must hold only entries, comments and blank lines:
    anything else (a configuration file given by mistake) is refused, and left as it was."""
    if (problem := user_name_problem(username)) is not None:
        raise PasswordFileError(problem)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        created = False
    except FileNotFoundError:
        lines, created = [], True
    except (OSError, UnicodeDecodeError) as error:
        raise PasswordFileError(f"{path}: cannot read the users file: {error}") from None
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        name, sep, stored = text.partition(":")
        if text and not text.startswith("#") and (not sep or not name or _parse(stored) is None):
            raise PasswordFileError(
                f"{path}, line {number}: not a users file (expected user:$scrypt$...); nothing changed"
            )
    entry = f"{username}:{hash_password(password)}"
    replaced = False
    for i, line in enumerate(lines):
        if line.split(":", 1)[0] == username:
            lines[i] = entry
            replaced = True
    if not replaced:
        lines.append(entry)
    partial = path.with_name(path.name + ".tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as stream:
        stream.write("\n".join(lines) + "\n")
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(partial, path)
    return created


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
