"""Reactions: rules that turn a site's replies into shaping effects (KumoMTA's "TSA").

A rule (`[[reaction]]`, or one shipped in `reactions.toml` next to this module) has a
regular expression searched for in a reply as one line, `"<code> <enhanced> <text>"` (what
the bounce classifier reads too), optional scopes (a provider, a site glob, a recipient domain
glob), and an action with a duration:

* `suspend`: the site (or the source's path to it, or the provider) takes no mail;
* `limit`: its connection limit and/or message rate are lowered;
* `bounce`: what waits for it is bounced.

This module only decides *whether* a reply matches and *what* the effect would be
(`Reactions.match`); `pigeon.shaping.effects` makes effects live on every worker and node,
and the dispatcher applies them. Only replies of 400 and above are looked at: a 2xx never
reacts, and nothing is searched on the common path.

Effects apply to a *key*, like the throttles' limit keys: `site:<site>`, `path:<source>-><site>`
(scope "source": the ready queue's source and site, whatever its domain or TLS policy: the
sending address a provider judges, on every queue from it to that site) or
`provider:<name>`. The dispatcher asks for a ready queue's three keys.

Shipped rules are conservative (short durations, only replies whose meaning the provider
documents) and can be replaced or turned off one by one (`[[reaction]]` with the same `id`,
`enabled = false`) or all at once (`[delivery] default_reactions = false`).
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from pigeon.config.patterns import site_matches
from pigeon.config.schema import Duration, ReactionConfig, decode_hook
from pigeon.shaping.gcra import Rate
from pigeon.shaping.providers import Providers, shipped
from pigeon.smtp.replies import Reply

SHIPPED: Final = Path(__file__).with_name("reactions.toml")

ProviderOf = Callable[[str], "str | None"]
"""A site's provider name (None: none known)."""


def shipped_provider_of(providers: Providers | None = None) -> ProviderOf:
    """A site's provider name by `providers`' MX host suffixes (default: the shipped providers;
    a node gives its shaping rules' own: `[[provider]]` blocks, then the shipped ones)."""
    known = providers if providers is not None else Providers(shipped())

    def provider_of(site: str) -> str | None:
        found = known.for_site(site)
        return found.name if found is not None else None

    return provider_of


@dataclass(frozen=True, slots=True)
class Reaction:
    """One rule, compiled."""

    id: str
    pattern: re.Pattern[str]
    action: str  # "suspend" | "limit" | "bounce"
    duration: float
    scope: str = "site"  # "site" | "source" | "provider"
    providers: tuple[str, ...] = ()  # only sites of these providers (none: any site)
    site: str | None = None
    domain: str | None = None
    connection_limit: int | None = None
    max_message_rate: Rate | None = None
    rate_text: str | None = None  # as written, for effects and records
    threshold: tuple[int, float] | None = None  # (matching replies, within seconds) before it acts

    def applies(self, site: str, domain: str, provider: str | None) -> bool:
        """Whether this rule's scopes (not its pattern) cover a reply from `site` about mail to `domain`."""
        if self.providers and provider not in self.providers:
            return False
        if self.site is not None and not site_matches(site, self.site):
            return False
        return self.domain is None or fnmatch.fnmatchcase(domain, self.domain)

    def key(self, path: str, site: str, provider: str | None) -> str:
        """The key its effect applies to, for a reply on the ready queue `path` (`source->site`)."""
        if self.scope == "source":
            return path_key(path)
        if self.scope == "provider" and provider is not None:
            return provider_key(provider)
        return site_key(site)


def site_key(site: str) -> str:
    return f"site:{site}"


def path_key(path: str) -> str:
    """A ready queue's key, by its path `source->site`."""
    return f"path:{path}"


def provider_key(provider: str) -> str:
    return f"provider:{provider}"


class ReactionError(ValueError):
    """A rule cannot be used: `key` names the field, the message says why."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason)
        self.key = key


def compile_rule(config: ReactionConfig) -> Reaction:
    """A `[[reaction]]` table as a rule; `ReactionError` names the field that is wrong."""
    for key in ("match", "action"):
        if getattr(config, key) is None:
            raise ReactionError(key, "missing (a rule needs match and action; only `enabled = false` goes without)")
    assert config.match is not None and config.action is not None
    try:
        pattern = re.compile(config.match, re.IGNORECASE)
    except re.error as error:
        raise ReactionError("match", f"{config.match!r} is not a regular expression: {error}") from None
    rate = None
    if config.max_message_rate is not None:
        try:
            rate = Rate.parse(config.max_message_rate)
        except ValueError as error:
            raise ReactionError("max_message_rate", str(error)) from None
    if config.action == "limit" and config.connection_limit is None and rate is None:
        raise ReactionError("action", 'a "limit" needs connection_limit, max_message_rate or both')
    if config.action != "limit" and (config.connection_limit is not None or rate is not None):
        raise ReactionError("action", f'connection_limit and max_message_rate are for "limit", not {config.action!r}')
    providers = (config.provider,) if isinstance(config.provider, str) else tuple(config.provider or ())
    if config.scope == "provider" and not providers:
        raise ReactionError("scope", 'scope = "provider" needs provider = "<name>"')
    if config.duration <= 0:
        raise ReactionError("duration", "must be above zero")
    threshold = parse_threshold(config.threshold) if config.threshold is not None else None
    return Reaction(
        id=config.id,
        pattern=pattern,
        action=config.action,
        duration=float(config.duration),
        scope=config.scope,
        providers=providers,
        site=config.site,
        domain=config.domain.lower() if config.domain else None,
        connection_limit=config.connection_limit,
        max_message_rate=rate,
        rate_text=config.max_message_rate,
        threshold=threshold,
    )


def parse_threshold(text: str) -> tuple[int, float]:
    """ "5/10m" -> (5, 600.0): that many matching replies within that long."""
    count, slash, within = text.partition("/")
    try:
        if not slash or not count.strip().isdigit() or int(count) < 1:
            raise ValueError
        seconds = float(decode_hook(Duration, within.strip()))
        if seconds <= 0:
            raise ValueError
    except ValueError:
        reason = f'{text!r} is not a threshold: write "N/DURATION", such as "5/10m" (5 matching replies in 10 min)'
        raise ReactionError("threshold", reason) from None
    return int(count), seconds


def shipped_rules(path: Path = SHIPPED) -> list[ReactionConfig]:
    """The rules Pigeon ships (`reactions.toml`)."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return msgspec.convert(data.get("reaction", []), list[ReactionConfig], dec_hook=decode_hook)


def effective_rules(configured: Sequence[ReactionConfig], *, defaults: bool = True) -> list[ReactionConfig]:
    """The rules in force: the user's, then the shipped ones they do not replace (by `id`)
    when `defaults`; those turned off (`enabled = false`) left out."""
    mine = {rule.id for rule in configured}
    rules = list(configured) + ([r for r in shipped_rules() if r.id not in mine] if defaults else [])
    return [rule for rule in rules if rule.enabled]


class Reactions:
    """The rules in force, in order; the first whose scopes cover a reply and whose pattern
    matches it wins."""

    def __init__(self, rules: Sequence[Reaction], provider_of: ProviderOf | None = None) -> None:
        self.rules = list(rules)
        self._provider_of = provider_of if provider_of is not None else shipped_provider_of()
        self._providers: dict[str, str | None] = {}

    @classmethod
    def from_config(
        cls, configured: Sequence[ReactionConfig], *, defaults: bool = True, provider_of: ProviderOf | None = None
    ) -> Reactions:
        return cls([compile_rule(rule) for rule in effective_rules(configured, defaults=defaults)], provider_of)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def provider(self, site: str) -> str | None:
        """`site`'s provider (cached: a site's MX hosts name it for good)."""
        try:
            return self._providers[site]
        except KeyError:
            if len(self._providers) > 10_000:
                self._providers.clear()
            found = self._providers[site] = self._provider_of(site)
            return found

    def match(self, reply: Reply, site: str, domain: str) -> Reaction | None:
        """The rule `reply` (from `site`, about mail to `domain`) triggers, if any."""
        if reply.code < 400 or not self.rules:
            return None
        provider = self.provider(site)
        line = str(reply)
        for rule in self.rules:
            if rule.applies(site, domain, provider) and rule.pattern.search(line):
                return rule
        return None
