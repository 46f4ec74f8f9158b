"""Every warning a start says about its configuration, in one list: the node's start (worker 0),
each reload (those a reload can act on) and `pigeon serve --check` all say it from here, so the
check an operator runs before a SIGHUP or a restart cannot drift from what the start says.

Each is said, not refused: the node starts with it (a firewall may stand in front of a wide
`relay_networks`, a route's order may be an edit in progress), and the text says what to do.

What the start's environment alone decides is not here: who starts it (as root without
`[node] user`: `pigeon.node.privileges`), its open files limit (`pigeon.node.descriptors`), a
`[[source]]` address gone since the node's first start (every worker, `config.load.unbindable_sources`),
the policy module's (misspelt hook names, modules beside it that `import` cannot reach: its
`Policy.warnings`, said where it is loaded, the same way as these).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from pigeon.config.load import unreachable_delay_warnings
from pigeon.config.schema import Config, InboundRouteConfig, Network, RouteConfig
from pigeon.node.exposure import Exposure, http_in_clear, untrusted_dane_resolvers, unverified_smart_hosts
from pigeon.route_tenants import shared_account_warnings

_WIDE_RELAY_PREFIX: Final = {4: 8, 6: 16}
"""A relay network with a shorter prefix than this that is not all private addresses
(10.0.0.0/8 and fc00::/7 are not warned about) takes in a good part of the Internet."""


def config_warnings(config: Config, config_path: Path | None, exposure: Exposure, *, start: bool) -> Iterator[str]:
    """What to say of `config` (from the file `config_path`; None: the defaults): at a start
    (`start`: also what only a restart changes, so a reload does not say it again) and at each
    reload, by worker 0 (every worker reads the same), and by `pigeon serve --check`.
    `exposure` says each file others may read once while it stays so (`Exposure`)."""
    if config.dkim:  # (its module imports `cryptography`: not for a node without [[dkim]])
        from pigeon.dkim.signing import shared_key_warnings

        yield from shared_key_warnings(config.dkim)
    if config.smtp.tls_certificate is not None:
        from pigeon.listener.tls import expiry_warning

        # The configured one: the self-signed one Pigeon makes no client verifies anyway.
        if (expiring := expiry_warning(config.smtp.tls_certificate)) is not None:
            yield expiring
    yield from open_relays(config.smtp.relay_networks)
    yield from dead_routes(config.route)
    yield from shared_account_warnings(config.route)
    yield from unverified_smart_hosts(config)
    yield from inbound_route_warnings(config.inbound)
    yield from unreachable_delay_warnings(config)
    yield from exposure.warnings(config, config_path)
    if not start:
        return
    if not config.delivery.enabled:
        # Nothing else tells a node that only accepts from one that delivers, until mail is
        # found waiting.
        yield (
            "delivery is off ([delivery] enabled = false): mail is accepted and spooled, and none delivered "
            "until it is enabled and the node restarted"
        )
        if config.inbound:  # a receive-only node is an easy trap: its mailboxes work, its SMTP routes wait
            yield (
                "[delivery] enabled = false: SMTP mail for the [[inbound]] routes "
                f"{', '.join(_route_name(route) for route in config.inbound)} is accepted and spooled, but not handed "
                "to its target until delivery is enabled ([[mailbox]]es are watched as usual)"
            )
    elif (untrusted := untrusted_dane_resolvers(config)) is not None:  # ([dane] enabled takes a restart)
        # The AD bit is worth what the path to the resolver is: an attacker on it sets it at will.
        yield untrusted
    if (clear := http_in_clear(config)) is not None:  # (a new address takes a restart)
        yield clear
    if config.mailbox and config.redis.url is None:  # ([[mailbox]] and [redis] take a restart)
        from pigeon.inbound.mailbox import SINGLE_NODE_RISK

        for mailbox in config.mailbox:
            # Loud: N nodes on one mailbox without Redis hand every message over N times.
            yield (
                f"mailbox {mailbox.name}: {SINGLE_NODE_RISK} (run one node per mailbox, or give the nodes a shared "
                "[redis] url)"
            )


def open_relays(networks: list[Network]) -> Iterator[str]:
    """What to say of each `relay_networks` entry that lets much of the Internet relay: then
    Pigeon is an open relay, unless a firewall keeps all but one's own clients from its SMTP
    port (said, not refused: that may be how it runs)."""
    for entry in networks:
        network = entry.network
        if network.prefixlen >= _WIDE_RELAY_PREFIX[network.version] or network.is_private:
            continue
        what = "the whole Internet" if network.prefixlen == 0 else f"{network.num_addresses:,} addresses"
        yield (
            f"[smtp] relay_networks entry {str(entry)!r} covers {what}: any client there may relay mail through "
            "Pigeon to any domain without AUTH (an open relay); keep it only if a firewall lets none but your own "
            "clients reach the SMTP port"
        )


def dead_routes(routes: list[RouteConfig]) -> Iterator[str]:
    """What to say of each `[[route]]` an earlier one shadows: the first that matches a domain
    wins, so a later one that matches nothing the earlier does not is never used (said, not
    refused: the order may be a slip, or an edit in progress)."""
    for later, route in enumerate(routes):
        pattern = route.domain.lower()
        for earlier, first in enumerate(routes[:later]):
            # An earlier glob that matches the later pattern's own text matches every domain
            # the later one does ("*.test" shadows "*.mx.test" and "a.test").
            if fnmatch.fnmatchcase(pattern, first.domain.lower()):
                yield (
                    f"[[route]] #{later + 1} (domain {route.domain!r}) is never used: #{earlier + 1} (domain "
                    f"{first.domain!r}) comes first and matches every domain it does (the first route that matches "
                    "wins): move it up, or remove it"
                )
                break


def inbound_route_warnings(routes: list[InboundRouteConfig]) -> Iterator[str]:
    """What to say of an `[[inbound]]` route that takes every domain's mail (relayed mail too:
    it goes to the target, not out), and of each an earlier one hides (the first that matches
    wins, in the file's order). Said, not refused: a node that only receives may mean it."""
    patterns = [_inbound_pattern(route) for route in routes]
    for index, (route, pattern) in enumerate(zip(routes, patterns, strict=True)):
        domain = pattern.rpartition("@")[2]
        if domain.strip("*") == "":
            yield (
                f"[[inbound]] #{index + 1} ({_inbound_text(route)}) takes mail for every domain: what clients of "
                f"relay_networks or AUTH send to any domain goes to target {route.target!r} too, not out; name the "
                "application's domains if it should not"
            )
        for earlier, first in enumerate(patterns[:index]):
            # As for [[route]]s: an earlier glob that matches the later pattern's own text
            # matches every address the later one does.
            if fnmatch.fnmatchcase(pattern, first):
                yield (
                    f"[[inbound]] #{index + 1} ({_inbound_text(route)}) is never used: #{earlier + 1} "
                    f"({_inbound_text(routes[earlier])}) comes first and takes every address it does (the first "
                    "route that matches wins): move it up, or remove it"
                )
                break


def _inbound_pattern(route: InboundRouteConfig) -> str:
    """A route's addresses as one glob over `local@domain`."""
    if route.recipient is not None:
        return route.recipient.lower() if "@" in route.recipient else f"{route.recipient.lower()}@*"
    return f"*@{(route.domain or '').lower()}"


def _route_name(route: InboundRouteConfig) -> str:
    """An `[[inbound]]` route as a warning names it: "recipient reply+*@app.example -> app"."""
    which = f"recipient {route.recipient}" if route.recipient else f"domain {route.domain}"
    return f"{which} -> {route.target}"


def _inbound_text(route: InboundRouteConfig) -> str:
    return f"recipient {route.recipient!r}" if route.recipient is not None else f"domain {route.domain!r}"
