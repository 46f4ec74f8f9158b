"""Bearer tokens with scopes for the HTTP API.

Tokens come from the config (`[[http.token]]`) and, unless turned off, from the local token
file `<spool path>/api-token`, made at first start with every scope: the `pigeon` commands on
the same machine read it, so an operator who can read the spool needs no configuration.

Every comparison runs in constant time over every known token, so the response time tells
nothing about how much of a guess was right, nor which token it was close to.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from aiohttp import web

from pigeon.config.schema import LOCAL_TOKEN_NAME, Config

Scope = Literal["inject", "admin", "read"]
ALL_SCOPES: Final[tuple[Scope, ...]] = ("inject", "admin", "read")
LOCAL_TOKEN_FILE: Final = "api-token"
CURSOR_KEY_FILE: Final = "cursor-key"
"""The key that seals the paging cursors a token bound to tenants is given (`tenancy.seal_cursor`),
made at first start: the node's supervisor and workers read the same one, and it outlives a
restart, so a cursor given before one still pages on after it."""


@dataclass(frozen=True, slots=True)
class _Token:
    name: str
    digest: bytes  # SHA-256 of the secret: equal lengths for compare_digest
    scopes: frozenset[str]


class Tokens:
    """The tokens a listener accepts."""

    def __init__(
        self,
        tokens: Sequence[tuple[str, str, Sequence[str]]],
        bindings: dict[str, frozenset[str]] | None = None,
        cursor_key: bytes | None = None,
        routing: dict[str, tuple[str, ...]] | None = None,
        status_token_required: bool = False,
    ) -> None:
        self._tokens = [_Token(name, _digest(secret), frozenset(scopes)) for name, secret, scopes in tokens]
        self._bindings = bindings or {}
        self._routing = routing or {}
        self.status_token_required = status_token_required
        """`[http] status_token_required`: /metrics and /healthz's detail need `status_holder`'s token."""
        self.cursor_key = cursor_key if cursor_key is not None else secrets.token_bytes(32)
        """Seals the paging cursors of tokens bound to tenants (`CURSOR_KEY_FILE`; made up, for
        tokens not made from a config)."""

    @classmethod
    def from_config(cls, config: Config) -> Tokens:
        spool_path = config.spool.path
        key = hashlib.sha256(_ensure_secret(spool_path, CURSOR_KEY_FILE).encode()).digest()
        tokens = cls(_configured(config, spool_path), _bindings(config), key, _routing(config))
        tokens.status_token_required = config.http.status_token_required
        return tokens

    def take(self, config: Config, spool_path: Path) -> None:
        """A reload's `[[http.token]]`s (and `local_token`), in force for the next request: a
        token removed (leaked, say) is refused from now on, one added is taken, without a
        restart. `spool_path`: the running spool's, whose local token stays the node's."""
        self._tokens = Tokens(_configured(config, spool_path))._tokens
        self._bindings = _bindings(config)
        self._routing = _routing(config)
        self.status_token_required = config.http.status_token_required

    def binding(self, holder: str) -> frozenset[str] | None:
        """The tenants whose mail the token called `holder` may inject, see and act on
        (`[[http.token]] tenants`, `tenancy`); None: any (unbound, as the local token always
        is). Asked right after `holder`, on the same loop turn, so a reload cannot come between
        the two."""
        return self._bindings.get(holder)

    def routing_domains(self, holder: str) -> tuple[str, ...]:
        """The domain globs a rebind of the token called `holder`, bound to tenants, may route
        their mail as (`[[http.token]] routing_domains`, `tenancy.confine_routing`); () for none.
        Asked with `binding`, on the same loop turn."""
        return self._routing.get(holder, ())

    def holder(self, request: web.Request, scope: Scope) -> str:
        """The name of the token the request carries, if it grants `scope`.

        Raises 400 (two Authorization headers), 401 (no or unknown token) or 403 (a known
        token without the scope), each with a JSON body that says what to do.
        """
        found = self._known(request)
        if scope not in found.scopes:
            raise _error(web.HTTPForbidden, f"token {found.name!r} lacks the {scope!r} scope")
        return found.name

    def status_holder(self, request: web.Request) -> str:
        """The name of the token a request for the node's state carries (/metrics, /healthz's
        detail: every tenant's queue names, recipient domains and counts), if it may see it: a
        `read` token bound to no tenant. Raises as `holder` does, and 403 for a bound token."""
        holder = self.holder(request, "read")
        tenants = self._bindings.get(holder)
        if tenants is not None:
            names = ", ".join(sorted(tenants))
            raise _error(
                web.HTTPForbidden,
                f"token {holder!r} is bound to tenant{'' if len(tenants) == 1 else 's'} {names}: /metrics and "
                "/healthz's detail show every tenant's queues, recipient domains and counts ([http] "
                "status_token_required); ask with a 'read' token bound to no tenant",
            )
        return holder

    def shows_status(self, request: web.Request) -> bool:
        """Whether /healthz may show `request` its components: `status_token_required` is off, or
        the request carries `status_holder`'s token."""
        if not self.status_token_required:
            return True
        try:
            self.status_holder(request)
        except web.HTTPException:
            return False
        return True

    def known(self, request: web.Request) -> str:
        """The name of the token the request carries, whatever its scopes: its headers alone
        decide, so a caller can refuse (401, as `holder`) before reading the body."""
        return self._known(request).name

    def _known(self, request: web.Request) -> _Token:
        given = request.headers.getall("Authorization", [])
        if len(given) > 1:
            # Not a list field (RFC 9110 11.6.2): taking either one would let a proxy that
            # adds its own header and the client disagree on who is asking.
            raise _error(web.HTTPBadRequest, f"send one Authorization header, not {len(given)}")
        header = given[0] if given else ""
        kind, _, secret = header.partition(" ")
        if kind.lower() != "bearer" or not secret.strip():
            raise _error(web.HTTPUnauthorized, "send 'Authorization: Bearer <token>' (see [[http.token]])")
        digest = _digest(secret.strip())
        found: _Token | None = None
        for token in self._tokens:  # no early exit: every token costs the same comparison
            if hmac.compare_digest(token.digest, digest):
                found = token
        if found is None:
            raise _error(web.HTTPUnauthorized, "unknown token")
        return found


def _configured(config: Config, spool_path: Path) -> list[tuple[str, str, Sequence[str]]]:
    tokens: list[tuple[str, str, Sequence[str]]] = [(t.name, t.token, tuple(t.scopes)) for t in config.http.token]
    if config.http.local_token:
        tokens.append((LOCAL_TOKEN_NAME, ensure_local_token(spool_path), ALL_SCOPES))
    return tokens


def _bindings(config: Config) -> dict[str, frozenset[str]]:
    return {t.name: frozenset(t.tenants) for t in config.http.token if t.tenants is not None}


def _routing(config: Config) -> dict[str, tuple[str, ...]]:
    return {t.name: tuple(t.routing_domains) for t in config.http.token if t.routing_domains}


def ensure_local_token(spool_path: Path) -> str:
    """The local token, made (once, whoever starts first) if missing."""
    return _ensure_secret(spool_path, LOCAL_TOKEN_FILE)


def _ensure_secret(spool_path: Path, name: str) -> str:
    """The 32 random bytes (in hex) of the file `name` in the spool, made (once, whoever starts
    first: a lock of its own) if missing, mode 0600."""
    path = spool_path / name
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    spool_path.mkdir(parents=True, exist_ok=True)
    lock = os.open(spool_path / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            temporary = path.with_name(path.name + ".tmp")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as stream:
                stream.write(secrets.token_hex(32) + "\n")
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temporary, path)
        return path.read_text().strip()
    finally:
        os.close(lock)


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


def _error(kind: type[web.HTTPError], message: str) -> web.HTTPError:
    headers = {"WWW-Authenticate": 'Bearer realm="pigeon"'} if kind is web.HTTPUnauthorized else None
    body = {"error": message, "field": "Authorization"}  # the header at fault, whichever refusal
    return kind(text=json.dumps(body), content_type="application/json", headers=headers)
