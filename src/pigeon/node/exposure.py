"""Warnings about secrets within reach of others: a file holding them that users other than
Pigeon's may read, and an HTTP API listening beyond loopback in plain HTTP.

The files: the config file when it holds secrets (`[[http.token]]`s, a webhook's `secret` or
authorization header, a password in a Redis URL or a PostgreSQL DSN, a `[[mailbox]]` password),
the SMTP users file, the TLS private key, the DKIM private keys, the `[[mailbox]]` password files,
the local API token and the key of bound tokens' paging cursors. One is warned about when other
users may read it (mode `o+r`), or its group may and that group is none of the node's own
(`chgrp pigeon` with mode 0640 is how a root-owned file is shared with the user the node runs
as: README's set-up does so with the config file), as ssh does for a private key. Nothing is
refused: the warning says what to do.

Said by one process of a node (worker 0, with the other warnings of the config:
`pigeon.node.config_warnings`), at start and at each reload, once per file while it stays so: a
file made private and then readable again is named again; and by `pigeon serve --check`. The
HTTP listener has no TLS of its own, so a `[http] listen` address other than loopback carries the
API's bearer tokens in clear: said at start (a new address takes a restart).
"""

from __future__ import annotations

import ipaddress
import os
import stat
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from pigeon.config.schema import Config, PostgresqlTarget, SidekiqTarget, WebhookTarget

_SECRET_HEADER_WORDS: Final = ("auth", "cookie", "token", "key", "secret", "password", "signature")
"""A webhook header whose name holds one of these is taken to carry a secret (`Authorization`,
`X-Api-Key`, ...); other headers (`X-Source`) are not."""


class Exposure:
    """What one process has said: each file once while it stays readable by others."""

    def __init__(self, groups: frozenset[int] | None = None) -> None:
        """`groups`: those of the user the node runs as, a file's group among them being no
        other user's (None: this process's own, as the node's processes are that user)."""
        self._said: set[Path] = set()
        self._groups = groups

    def warnings(self, config: Config, config_path: Path | None) -> Iterator[str]:
        """What to say of each file holding secrets that others may read, not said before."""
        for path, holds in secret_files(config, config_path):
            readers = readers_besides_us(path, self._groups)
            if readers is None:
                self._said.discard(path)  # fixed: said again if it is ever readable again
                continue
            if path in self._said:
                continue
            self._said.add(path)
            whom, mode = readers
            yield (
                f"{path} is readable by {whom} (mode {mode:04o}), and it holds {holds}: chmod 600 {path} (or 640 "
                "with a group that only the user Pigeon runs as is in)"
            )


def unverified_smart_hosts(config: Config) -> Iterator[str]:
    """What to say of each `[[route]]` that authenticates over TLS without verifying its smart
    host's certificate (its `tls_verify`, else `[delivery] tls_verify`, not true): its password
    goes to whoever presents any certificate there, which an attacker on the path can. Said,
    not refused: a smart host on a private network may have no certificate that verifies. At
    start, each reload (worker 0) and `pigeon serve --check`; never the password."""
    for number, route in enumerate(config.route, 1):
        if route.auth_username is None or route.next_hop is None:
            continue
        verify = route.tls_verify if route.tls_verify is not None else config.delivery.tls_verify
        if verify or (route.tls or config.delivery.tls) == "disabled":
            continue  # (in clear on purpose, allow_plaintext_auth: no certificate to verify)
        yield (
            f"[[route]] #{number} (domain {route.domain!r}) authenticates to {route.next_hop} as "
            f"{route.auth_username!r} without tls_verify = true: its password goes to whoever presents any "
            "certificate there (an attacker on the path can): set tls_verify = true on the route (and ca_file "
            "for a private CA)"
        )


def untrusted_dane_resolvers(config: Config, resolv_conf: str = "/etc/resolv.conf") -> str | None:
    """What to say when `[dane] enabled` trusts the AD bit of nameservers beyond this host's
    loopback (an attacker on the path sets it at will): those of `[dns] nameservers`, or with
    none named, those `resolv_conf` names (the system's, which the resolver asks then), each
    said. None: DANE is off, or every nameserver is on loopback ("localhost" is). At start
    (worker 0) and `pigeon serve --check`: `[dane] enabled` takes a restart."""
    if not config.dane.enabled:
        return None
    named = [entry.host for entry in config.dns.nameservers]
    where = "[dns] nameservers"
    if not named:
        named = _resolv_conf_nameservers(resolv_conf)
        where = f"{resolv_conf} (no [dns] nameservers)"
        if not named:
            return (
                f"[dane] enabled trusts the AD bit of its nameservers' answers, and {where} names none that "
                "Pigeon could read: run a validating resolver (unbound) on 127.0.0.1 and name it in [dns] nameservers"
            )
    remote = [host for host in named if not _is_loopback(host)]
    if not remote:
        return None
    return (
        f"[dane] enabled trusts the AD bit of its nameservers' answers, and {where} names "
        f"{', '.join(remote)}, not on this host's loopback (an attacker on the path sets AD at will): run a "
        "validating resolver (unbound) on 127.0.0.1 and name it in [dns] nameservers"
    )


def _resolv_conf_nameservers(path: str) -> list[str]:
    """The addresses of resolv.conf's `nameserver` lines (a scope, "%eth0", taken off); none
    for a file that cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            lines = file.read().splitlines()
    except OSError:
        return []
    found: list[str] = []
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            found.append(words[1].partition("%")[0])
    return found


def http_in_clear(config: Config) -> str | None:
    """What to say when the API listens beyond loopback: it speaks plain HTTP only."""
    listen = config.http.listen
    if _is_loopback(listen.host):
        return None
    return (
        f"[http] listen {listen} is not a loopback address, and the HTTP listener has no TLS: API bearer tokens "
        "(and what the API answers) cross the network in clear; listen on loopback and put a TLS-terminating "
        "proxy in front for other machines"
    )


def _is_loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost: it may be anything


def secret_files(config: Config, config_path: Path | None) -> Iterator[tuple[Path, str]]:
    """Each file the node reads that holds secrets, with what it holds."""
    if config_path is not None and (held := config_secrets(config)):
        yield config_path, ", ".join(held)
    smtp = config.smtp
    if smtp.auth_users is not None:
        yield smtp.auth_users, "the SMTP users' password hashes ([smtp] auth_users)"
    if smtp.starttls:
        if smtp.tls_private_key is not None:
            yield smtp.tls_private_key, "the TLS private key ([smtp] tls_private_key)"
        else:
            yield config.spool.path / "tls" / "selfsigned.key", "the self-signed TLS certificate's private key"
    for dkim in config.dkim:
        yield dkim.private_key, f"a DKIM private key ([[dkim]] {dkim.selector!r})"
    for mailbox in config.mailbox:
        if mailbox.password_file is not None:
            yield mailbox.password_file, f"the password of [[mailbox]] {mailbox.name!r}"
    for route in config.route:
        if route.auth_password_file is not None:
            yield route.auth_password_file, f"the smart host's password of [[route]] {route.domain!r}"
    if config.http.local_token:
        yield config.spool.path / "api-token", "the local API token ([http] local_token)"
    yield config.spool.path / "cursor-key", "the key of the paging cursors of tokens bound to tenants"


def config_secrets(config: Config) -> list[str]:
    """What secrets the config itself holds (none: an empty list)."""
    held = []
    if config.http.token:
        held.append("[[http.token]] secrets")
    if config.redis.url is not None and _has_password(config.redis.url):
        held.append("the [redis] url's password")
    for target in config.target:
        if isinstance(target, WebhookTarget) and (
            target.secret or any(word in name.lower() for name in target.headers for word in _SECRET_HEADER_WORDS)
        ):
            held.append(f"[[target]] {target.name!r}'s secrets")
        elif isinstance(target, PostgresqlTarget) and _has_password(target.dsn):
            held.append(f"[[target]] {target.name!r}'s PostgreSQL password")
        elif isinstance(target, SidekiqTarget) and target.redis_url is not None and _has_password(target.redis_url):
            held.append(f"[[target]] {target.name!r}'s Redis password")
    held.extend(f"[[mailbox]] {m.name!r}'s password" for m in config.mailbox if m.password is not None)
    held.extend(f"[[route]] {r.domain!r}'s auth_password" for r in config.route if r.auth_password is not None)
    held.extend(
        f"[[log_hook]] {hook.name!r}'s secrets"
        for hook in config.log_hook
        if hook.secret or any(word in name.lower() for name in hook.headers for word in _SECRET_HEADER_WORDS)
    )
    return held


def _has_password(url: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(url)
        return bool(parts.password) or "password=" in parts.query.lower()
    except ValueError:
        return False


def readers_besides_us(path: Path, groups: frozenset[int] | None = None) -> tuple[str, int] | None:
    """Who, besides the user the node runs as (in `groups`; None: this process's), may read
    `path` ("other users", "the members of group 'staff'"), with the file's mode; None when
    none may, or the file is not there to say."""
    try:
        status = os.stat(path)
    except OSError:
        return None  # (a file that must be there is refused when it is read, with its reason)
    mode = stat.S_IMODE(status.st_mode)
    if mode & stat.S_IROTH:
        return "other users", mode
    ours = groups if groups is not None else {os.getegid(), *os.getgroups()}
    if mode & stat.S_IRGRP and status.st_gid not in ours:
        return f"the members of group {_group_name(status.st_gid)}", mode
    return None


def _group_name(gid: int) -> str:
    try:
        import grp

        return f"{grp.getgrgid(gid).gr_name!r}"
    except (KeyError, ImportError):
        return str(gid)
