"""SMTP AUTH users: a file of salted scrypt hashes, written by `pigeon passwd`.

One user per line, `name:$scrypt$n=16384,r=8,p=1$<salt>$<hash>` (salt and hash in base64);
blank lines and `#` comments are allowed. A line may end with `:tenants=A,B`: the user is then
bound to those tenants, and its mail may claim no other (an empty list: none at all). A user
without it may claim any tenant, as every user could before bindings were. scrypt (RFC 7914,
in the standard library) is memory-hard, so a stolen file is expensive to attack. Checking a
password takes tens of milliseconds of CPU: the listener runs it in a thread, never on the
event loop.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from pigeon.queue.names import queue_part_problem

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


_TENANTS: Final = "tenants="


def binding_problem(tenants: Sequence[str]) -> str | None:
    """Why `tenants` cannot be a credential's binding (None: it can): each one must name a
    queue (`queue_part_problem`), as a `[[dkim]] tenant` must; a `,` would split it in a users
    file. Shared by the users file and `[[http.token]] tenants`."""
    for tenant in tenants:
        if not tenant:
            return "a tenant name is empty"
        if (problem := queue_part_problem(tenant)) is not None:
            return f"tenant {tenant[:60]!r} {problem}"
        if "," in tenant:
            return f"tenant {tenant[:60]!r} contains ',': it separates the tenants of a binding"
    return None


def parse_line(line: str) -> tuple[str, str, frozenset[str] | None] | None:
    """A users file's entry, `name:$scrypt$...[:tenants=A,B]`: its name, its stored hash and
    its binding (None: unbound); None when the line is no entry. An option other than
    `tenants=`, or a tenant that names no queue, makes it no entry: a misspelt binding must
    stop the file from loading, not leave the user free to claim any tenant."""
    name, sep, rest = line.partition(":")
    stored, more, option = rest.partition(":")
    if not sep or not name or _parse(stored) is None:
        return None
    if not more:
        return name, stored, None
    if not option.startswith(_TENANTS):
        return None
    listed = option[len(_TENANTS) :].strip()
    tenants = [t.strip() for t in listed.split(",")] if listed else []
    if binding_problem(tenants) is not None:
        return None
    return name, stored, frozenset(tenants)


class PasswordFile:
    """The users of one file, read once at start and at each SIGHUP."""

    def __init__(self, entries: dict[str, str], bindings: dict[str, frozenset[str]] | None = None) -> None:
        self._entries = entries
        self._bindings = bindings or {}

    @classmethod
    def load(cls, path: Path) -> PasswordFile:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise PasswordFileError(f"{path}: cannot read the users file: {error.strerror}") from None
        entries: dict[str, str] = {}
        bindings: dict[str, frozenset[str]] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            entry = parse_line(line)
            if entry is None:
                problem = _option_problem(line) or "expected user:$scrypt$...; write entries with `pigeon passwd`"
                raise PasswordFileError(f"{path}, line {number}: {problem}")
            name, stored, binding = entry
            entries[name] = stored
            bindings.pop(name, None)  # (a later line of the same user replaces an earlier one whole)
            if binding is not None:
                bindings[name] = binding
        return cls(entries, bindings)

    def binding(self, username: str) -> frozenset[str] | None:
        """The tenants `username` may send as (None: any, the user being unbound or unknown)."""
        return self._bindings.get(username)

    def __contains__(self, username: object) -> bool:
        return username in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, username: str) -> str | None:
        """The user's stored hash (None: no such user). A session authenticated against one
        file keeps its authentication under the next one only if this is the same in both: a
        user removed, or given a new password (even the same one: `pigeon passwd` salts it
        anew), must authenticate again."""
        return self._entries.get(username)

    def check(self, username: str, password: str) -> bool:
        """True if the user exists and the password matches. Slow: call it in a thread."""
        stored = self._entries.get(username)
        if stored is None:
            # Spend the same time as for a real user, so timing does not reveal names.
            hashlib.scrypt(password.encode("utf-8"), salt=_DUMMY_SALT, n=_N, r=_R, p=_P, dklen=32)
            return False
        return verify_password(stored, password)


def _option_problem(line: str) -> str | None:
    """What is wrong with the option of an entry `parse_line` refused for it; None when the
    line is no entry at all."""
    name, _, rest = line.partition(":")
    stored, more, option = rest.partition(":")
    if name and more and _parse(stored) is not None:
        if not option.startswith(_TENANTS):
            return f"unknown option {option.partition('=')[0][:40]!r} after the hash: the only one is tenants=A,B"
        listed = option[len(_TENANTS) :].strip()
        if (problem := binding_problem([t.strip() for t in listed.split(",")] if listed else [])) is not None:
            return f"tenants=: {problem}"
    return None


def user_name_problem(username: str) -> str | None:
    """Why `username` cannot be in a users file (None: it can): one line `user:hash` each."""
    if not username or ":" in username or any(c.isspace() for c in username) or not username.isprintable():
        return "a user name must be non-empty, without ':', spaces or control characters"
    return None


def read_users_file(path: Path) -> list[str] | None:
    """The lines of the users file `path`, which holds only entries, comments and blank lines;
    None when it does not exist. Raises PasswordFileError (its message ending `; nothing
    changed`) when it cannot be read or holds anything else: a configuration file given by
    mistake. `pigeon passwd` calls it before it asks for a password, and `set_password` again
    before it writes."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise PasswordFileError(f"{path}: cannot read the users file: {error}; nothing changed") from None
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if text and not text.startswith("#") and parse_line(text) is None:
            problem = _option_problem(text) or "not a users file (expected user:$scrypt$...)"
            raise PasswordFileError(f"{path}, line {number}: {problem}; nothing changed")
    return lines


def set_password(path: Path, username: str, password: str, tenants: Sequence[str] | None = None) -> bool:
    """Add or replace a user's entry, rewriting the file atomically with mode 0600; True if
    the file was created. A file that exists must hold only entries, comments and blank lines:
    anything else (a configuration file given by mistake) is refused, and left as it was.
    `tenants`: the user's binding, written as `:tenants=A,B`; None keeps the one a replaced
    entry has (a new password must not free a bound user to claim any tenant)."""
    if (problem := user_name_problem(username)) is not None:
        raise PasswordFileError(problem)
    if tenants is not None and (problem := binding_problem(tenants)) is not None:
        raise PasswordFileError(problem)
    read = read_users_file(path)
    lines, created = ([], True) if read is None else (read, False)
    kept: frozenset[str] | None = None
    for line in lines:
        text = line.strip()
        if text and not text.startswith("#") and (parsed := parse_line(text)) is not None and parsed[0] == username:
            kept = parsed[2]
    binding = kept if tenants is None else frozenset(tenants)
    entry = f"{username}:{hash_password(password)}"
    if binding is not None:
        entry += f":{_TENANTS}{','.join(sorted(binding))}"
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
