"""Shaping rules: the limits a ready queue is delivered under, and where each one came from.

A ready queue is looked up with a `ShapingQuery` (the recipient domain that opened it, its
site, the site's MX hosts, its egress source). Each setting is taken from the first of these
layers that sets it:

1. with a `[[source]]`, the user's first `[[shaping]]` block for that source (`source = ...`)
   whose `domain` glob matches the recipient domain, then the first for that source and the
   site's provider: a source's own blocks come before the blocks for every source;
2. the user's first `[[shaping]]` block (without `source`) whose `domain` glob matches;
3. the user's first `[[shaping]]` block (without `source`) for the site's provider
   (`provider = "gmail"`);
4. the shipped block for that provider (`providers.toml`; none with
   `[delivery] provider_defaults = false`);
5. `[delivery]`.

The throttle key (what connection slots and message rates are counted against, in the node
and, with Redis, in the cluster) is `provider:<name>` when the site is a provider's: every
domain hosted there, whichever MX host set led to it, shares one connection limit and one
rate. A domain block that sets its own `connection_limit` or `max_message_rate` takes its
domain out of them (key `domain:<d>`; a catch-all's, `site:<site>`): its limits are then its
own, not a share of the provider's. A site of no provider is counted alone, as `site:<site>`. From a `[[source]]`,
the key is the source's own, `<source>->provider:<name>` or `<source>->site:<site>`: each
address has its own standing with a provider (the implicit source keeps the keys above).

Among domain blocks, a catch-all (`domain = "*"`) ranks after every other matching block of
its source, wherever it stands in the file: a rule written for one domain wins over the rule
for all of them (the catch-all still gives what the specific block leaves unset).

Domains that share MX hosts share a ready queue, so a domain block could otherwise only apply
to all of them or to none. A domain matched by any block other than `*` therefore gets a ready
queue of its own (`source->domain@site`, `owns_queue`), shaped by its block; when that block
sets its own `connection_limit` or `max_message_rate`, they are counted under `domain:<d>`,
its alone. The site's shared queue (`ShapingQuery.shared`) is shaped by the catch-all alone.

`explain()` answers the same question with the origin of every setting, for
`pigeon shaping explain`.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec

from pigeon.config.load import block_line, key_line
from pigeon.config.schema import Config, DeliveryConfig, ShapingConfig, decode_hook
from pigeon.queue.names import ready_queue
from pigeon.shaping.gcra import Rate
from pigeon.shaping.providers import Provider, Providers, shipped, shipped_data, shipped_text

SETTINGS: Final = ("connection_limit", "max_deliveries_per_connection", "idle_timeout", "max_message_rate")
"""What a `[[shaping]]` block may set."""
_OWN_LIMITS: Final = ("connection_limit", "max_message_rate")
"""Set by a domain block, these make the domain's limits its own (not the provider's)."""
CATCH_ALL: Final = "*"
"""The domain pattern of a block for every domain: it ranks last and opens no queue of its own."""


@dataclass(frozen=True, slots=True)
class Shaping:
    """Limits for one destination (from `[delivery]`, refined by `[[shaping]]` and providers)."""

    connection_limit: int = 32
    max_deliveries_per_connection: int = 1000
    idle_timeout: float = 10.0
    max_message_rate: Rate | None = None
    connection_failures_before_delay: int = 3
    provider: str | None = None
    """The site's provider, if any (shown in the API's queues)."""
    key: str | None = None
    """The throttle key of these limits; None: the site's own (`site:<site>`)."""


@dataclass(frozen=True, slots=True)
class ShapingQuery:
    """What shaping is looked up by: one ready queue's destination."""

    domain: str
    """The recipient domain whose mail opened the queue."""
    site: str
    """The queue's site (`pigeon.delivery.routes.Destination.site`)."""
    hosts: tuple[str, ...] = ()
    """The site's MX hosts (the destination's hops); empty: read from `site`."""
    source: str | None = None
    """The egress `[[source]]` the queue's connections leave from; None: the implicit source."""
    security: str = ""
    """What the ready queue's name adds for its TLS policy (`Destination.security`)."""
    shared: bool = False
    """The site's shared ready queue (every domain without a queue of its own): only catch-all
    domain blocks apply to it, not those of the domain that happened to open it."""


def site_key(site: str) -> str:
    return f"site:{site}"


def domain_key(domain: str) -> str:
    return f"domain:{domain}"


def provider_key(name: str) -> str:
    return f"provider:{name}"


def source_key(source: str | None, key: str) -> str:
    """A key as counted for one egress source (the implicit source, None, keeps it as it is)."""
    return key if source is None else f"{source}->{key}"


@dataclass(frozen=True, slots=True)
class _Block:
    """One layer's settings: only those it sets, parsed, with its origin."""

    origin: str
    values: dict[str, Any]
    domain: str | None = None
    provider: str | None = None
    origins: dict[str, str] = field(default_factory=dict)
    source: str | None = None
    """Origins of single settings, where they differ from `origin` ([delivery]'s lines)."""

    def origin_of(self, name: str) -> str:
        return self.origins.get(name, self.origin)


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    value: Any  # int, seconds (float), a rate as written, or None (no limit)
    origin: str

    @property
    def text(self) -> str:
        if self.value is None:
            return "none"
        if self.name == "idle_timeout":
            return f"{self.value:g}s"
        return str(self.value)


@dataclass(frozen=True, slots=True)
class Explanation:
    """The limits of one destination, setting by setting, with where each came from."""

    query: ShapingQuery
    provider: Provider | None
    key: str
    settings: list[Setting] = field(default_factory=list)
    own_queue: bool = False
    """Whether the domain's mail waits in a ready queue of its own (not the site's shared one)."""
    queue: str = ""
    """The ready queue's name (`source->domain@site` or `source->site`)."""

    def as_dict(self) -> dict[str, Any]:
        """For `--json`."""
        return {
            "domain": self.query.domain,
            "site": self.query.site,
            "hosts": list(self.query.hosts),
            "source": self.query.source,
            "provider": self.provider.name if self.provider else None,
            "provider_mx_suffixes": list(self.provider.mx_suffixes) if self.provider else [],
            "key": self.key,
            "queue": self.queue,
            "own_queue": self.own_queue,
            "rate_key": self.key,  # connection slots and the message rate are counted under one key
            "settings": {s.name: {"value": s.value, "from": s.origin} for s in self.settings},
        }


class ShapingRules:
    """Looks up the `Shaping` of a destination (callable: the dispatcher's `shaping`)."""

    def __init__(
        self,
        delivery: _Block,
        *,
        domains: list[_Block],
        provided: list[_Block],
        shipped_blocks: list[_Block],
        providers: Providers,
        connection_failures_before_delay: int = 3,
        implicit_source: str = "default",
    ) -> None:
        self._delivery = delivery
        # A catch-all ranks after every other domain block (stable: file order otherwise).
        self._domains = sorted(domains, key=lambda block: block.domain == CATCH_ALL)
        self._provided = provided
        self._shipped = shipped_blocks
        self.providers = providers
        self._failures = connection_failures_before_delay
        self._implicit_source = implicit_source

    @classmethod
    def from_config(cls, config: Config, path: Path | None = None, text: str = "") -> ShapingRules:
        """The rules of a configuration; `path` and `text` (the file) name the origins' lines."""
        delivery = config.delivery
        user = [Provider.make(p.name, p.mx_suffixes) for p in config.provider]
        ours = shipped() if delivery.provider_defaults else []
        domains: list[_Block] = []
        provided: list[_Block] = []
        for index, block in enumerate(config.shaping):
            name = f"{path.name} [[shaping]] #{index + 1}" if path is not None else f"[[shaping]] #{index + 1}"
            parsed = _parsed(block, name, text if path is not None else "", index)
            (domains if block.domain is not None else provided).append(parsed)
        shipped_blocks: list[_Block] = []
        if delivery.provider_defaults:
            raw = shipped_data().get("shaping", [])
            blocks = msgspec.convert(raw, list[ShapingConfig], dec_hook=decode_hook)
            for index, block in enumerate(blocks):
                origin = f"shipped provider {block.provider} (providers.toml"
                shipped_blocks.append(_parsed(block, origin, shipped_text(), index, close=")"))
        return cls(
            _delivery_block(delivery, path, text),
            domains=domains,
            provided=provided,
            shipped_blocks=shipped_blocks,
            providers=Providers(user + ours),
            connection_failures_before_delay=delivery.connection_failures_before_delay,
            implicit_source=delivery.source,
        )

    def __call__(self, query: ShapingQuery) -> Shaping:
        explanation = self.explain(query)
        values = {s.name: s.value for s in explanation.settings}
        rate = values["max_message_rate"]
        return Shaping(
            connection_limit=values["connection_limit"],
            max_deliveries_per_connection=values["max_deliveries_per_connection"],
            idle_timeout=values["idle_timeout"],
            max_message_rate=Rate.parse(rate) if rate is not None else None,
            connection_failures_before_delay=self._failures,
            provider=explanation.provider.name if explanation.provider else None,
            key=explanation.key,
        )

    def provider_of(self, query: ShapingQuery) -> Provider | None:
        """The provider of a destination's site, if any."""
        return self.providers.match(query.hosts) if query.hosts else self.providers.for_site(query.site)

    def owns_queue(self, domain: str) -> bool:
        """Whether `domain`'s mail gets a ready queue of its own: a block other than the
        catch-all (for any source) matches it."""
        domain = domain.lower()
        return any(
            b.domain != CATCH_ALL and b.domain is not None and fnmatch.fnmatchcase(domain, b.domain)
            for b in self._domains
        )

    def explain(self, query: ShapingQuery) -> Explanation:
        """Every setting of a destination's limits and the layer it came from."""
        domain = query.domain.lower()
        provider = self.provider_of(query)
        own_queue = not query.shared and self.owns_queue(domain)
        layers: list[_Block] = []
        specific: list[_Block] = []  # blocks for this domain (not the catch-all) that apply
        owns: list[_Block] = []
        for source in (query.source, None) if query.source is not None else (None,):
            # The domain's own block, then the catch-all: `self._domains` ranks it last. A
            # shared queue is shaped by the catch-all alone, whichever domain opened it.
            for own in self._domain_blocks(domain, source, catch_all_only=query.shared):
                layers.append(own)
                owns.append(own)
                if own.domain != CATCH_ALL:
                    specific.append(own)
            if provider is not None and (block := self._first(self._provided, provider, source)) is not None:
                layers.append(block)
        if provider is not None and (block := self._first(self._shipped, provider, None)) is not None:
            layers.append(block)
        layers.append(self._delivery)
        settings = [
            next(Setting(name, layer.values[name], layer.origin_of(name)) for layer in layers if name in layer.values)
            for name in SETTINGS
        ]
        name = "connection_failures_before_delay"  # not shaped per block (yet)
        settings.append(Setting(name, self._failures, self._delivery.origin_of(name)))
        apart = any(name in own.values for own in owns for name in _OWN_LIMITS)
        if own_queue and any(name in own.values for own in specific for name in _OWN_LIMITS):
            key = domain_key(domain)  # the domain's own limits, in its own queue: its alone
        elif provider is not None and not apart:
            key = provider_key(provider.name)
        else:
            key = site_key(query.site)
        source = query.source or self._implicit_source
        queue = ready_queue(source, query.site, domain if own_queue else None, query.security)
        return Explanation(query, provider, source_key(query.source, key), settings, own_queue, queue)

    def _domain_blocks(self, domain: str, source: str | None, *, catch_all_only: bool) -> list[_Block]:
        """The first matching block of `source` for `domain` other than the catch-all, then
        the first catch-all of `source`."""
        found: list[_Block] = []
        specific = catch_all_only
        for block in self._domains:
            if block.source != source or block.domain is None:
                continue
            if block.domain == CATCH_ALL:
                found.append(block)
                break
            if not specific and fnmatch.fnmatchcase(domain, block.domain):
                found.append(block)
                specific = True
        return found

    @staticmethod
    def _first(blocks: list[_Block], provider: Provider, source: str | None) -> _Block | None:
        return next((b for b in blocks if b.provider == provider.name and b.source == source), None)


def _parsed(block: ShapingConfig, name: str, text: str, index: int, close: str = "") -> _Block:
    """A block's settings; each one's origin names its line in `text` (if given)."""
    values = {key: getattr(block, key) for key in SETTINGS if getattr(block, key) is not None}
    if "idle_timeout" in values:
        values["idle_timeout"] = float(values["idle_timeout"])
    origins: dict[str, str] = {}
    for key in values:
        line = block_line(text, "shaping", index, key) if text else None
        origins[key] = f"{name} line {line}{close}" if line else f"{name}{close}"
    header = block_line(text, "shaping", index) if text else None
    origin = f"{name} line {header}{close}" if header else f"{name}{close}"
    domain = block.domain.lower() if block.domain else None
    return _Block(origin, values, domain, block.provider, origins, block.source)


def _delivery_block(delivery: DeliveryConfig, path: Path | None, text: str) -> _Block:
    names = (*SETTINGS, "connection_failures_before_delay")
    values = {name: getattr(delivery, name) for name in names}
    values["idle_timeout"] = float(values["idle_timeout"])
    origins: dict[str, str] = {}
    for name in names:
        line = key_line(text, ["delivery", name]) if path is not None else None
        origins[name] = f"{path.name} [delivery] line {line}" if path is not None and line else "[delivery] default"
    return _Block("[delivery]", values, origins=origins)
