"""Mailbox providers: who runs a site's MX hosts, told by the hosts' names.

A `Provider` is a name and the DNS suffixes of its MX hosts: Gmail's hosts are all under
`google.com` or `googlemail.com`, whatever the recipient domain (gmail.com, or any Google
Workspace domain). Knowing the provider lets shaping hold one set of limits for all of it
(`provider:<name>`), and lets reactions to a provider's replies apply wherever its mail goes.

Matching rule: a site belongs to a provider when **every** one of its MX hosts is under one
of the provider's suffixes (the first provider, in order, that covers them all). "Most"
would be a guess: a domain whose MX list mixes Google with its own backup host, or with a
filtering gateway, gets some of its mail delivered by that other host, whose limits are not
Google's, and its site is not Google's site either. Such a domain keeps its own site's
limits. A site with no hosts (an inbound target) or whose hosts are IP literals belongs to
no provider.

A suffix is matched on label boundaries: `google.com` covers `google.com` and
`aspmx.l.google.com`, never `notgoogle.com`. It may be written `google.com`, `.google.com`
or `*.google.com`; all three mean the same.

The shipped providers (and their conservative limits) are in `providers.toml`, next to this
module; `shipped()` reads the providers from it.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Final

SHIPPED_FILE: Final = "providers.toml"
"""The shipped defaults, package data of `pigeon.shaping`."""

_LABEL: Final = re.compile(r"(?i)^[a-z0-9_]([a-z0-9_-]*[a-z0-9])?$")
_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_PORT: Final = re.compile(r":[0-9]+$")


def normalise_suffix(text: str) -> str:
    """`*.Google.com.` -> `google.com`. Raises ValueError for what is not a DNS suffix."""
    suffix = text.strip().lower().rstrip(".")
    if suffix.startswith("*."):
        suffix = suffix[2:]
    suffix = suffix.lstrip(".")
    if not suffix or not all(_LABEL.match(label) for label in suffix.split(".")):
        raise ValueError(f'{text!r} is not an MX host suffix like "google.com" or "*.google.com"')
    return suffix


def check_name(name: str) -> str:
    """A provider's name as written in limit keys and logs. Raises ValueError if unusable."""
    if not _NAME.match(name):
        raise ValueError(f"{name!r} is not a provider name: lower-case letters, digits, '.', '-', '_'")
    return name


@dataclass(frozen=True, slots=True)
class Provider:
    """A mailbox provider: its name and the suffixes its MX hosts' names end with."""

    name: str
    mx_suffixes: tuple[str, ...]

    @classmethod
    def make(cls, name: str, mx_suffixes: Iterable[str]) -> Provider:
        """A provider from names as a user writes them (checked and normalised)."""
        suffixes = tuple(normalise_suffix(s) for s in mx_suffixes)
        if not suffixes:
            raise ValueError(f"provider {name!r} needs at least one MX suffix")
        return cls(check_name(name), suffixes)

    def covers(self, host: str) -> bool:
        """Whether an MX host's name is under one of the suffixes."""
        host = host.lower().rstrip(".")
        return any(host == s or host.endswith("." + s) for s in self.mx_suffixes)


class Providers:
    """An ordered set of providers: the user's first, then the shipped ones."""

    def __init__(self, providers: Iterable[Provider] = ()) -> None:
        self._by_name: dict[str, Provider] = {}
        for provider in providers:
            # A later one with the same name does not replace the earlier: the user's come first.
            self._by_name.setdefault(provider.name, provider)

    def __iter__(self) -> Iterator[Provider]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def get(self, name: str) -> Provider | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return list(self._by_name)

    def match(self, hosts: Iterable[str]) -> Provider | None:
        """The provider every one of `hosts` belongs to (the first that covers them all), or None."""
        names = [h for h in hosts if h and not _is_address(h)]  # a static route's IP is no provider's
        if not names:
            return None
        return next((p for p in self._by_name.values() if all(p.covers(h) for h in names)), None)

    def for_site(self, site: str) -> Provider | None:
        """The provider of a ready queue's site (see `site_hosts`)."""
        return self.match(site_hosts(site))


def site_hosts(site: str) -> tuple[str, ...]:
    """The host names in a site (`pigeon.delivery.routes.Destination.site`): "a.mx,b.mx",
    "a.mx,b.mx:2525" or "relay.example:587". An address literal ("[192.0.2.1]:25") or an
    inbound target ("inbound:app") has none."""
    if site.startswith(("inbound:", "[")):
        return ()
    return tuple(host for host in _PORT.sub("", site).split(",") if host and not _is_address(host))


def _is_address(host: str) -> bool:
    return host.replace(".", "").isdigit() or ":" in host


@cache
def shipped_text() -> str:
    """The shipped defaults file (read once)."""
    return resources.files("pigeon.shaping").joinpath(SHIPPED_FILE).read_text(encoding="utf-8")


@cache
def shipped_data() -> dict[str, Any]:
    """The shipped defaults file, parsed (read once)."""
    return tomllib.loads(shipped_text())


def shipped() -> list[Provider]:
    """The providers Pigeon ships (`providers.toml`), in the file's order."""
    return [Provider.make(p["name"], p["mx_suffixes"]) for p in shipped_data().get("provider", [])]
