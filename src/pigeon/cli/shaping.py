"""`pigeon shaping check FILE`, `pigeon shaping explain DOMAIN`, `pigeon shaping status` and
`pigeon shaping end ID`: shaping, before, after and while it reacts.

`check` validates a configuration file (its `[[provider]]`, `[[shaping]]` and `[[reaction]]`
blocks one by one, then the whole file) and prints every problem with its key and line. `explain` resolves
a domain as the node would (its `[[route]]`s, then MX through `[dns] nameservers`), then
prints the site, the provider and every limit with the layer it came from. `status` lists the
live effects of shaping reactions on a running node (GET /api/v1/shaping/effects): a table for
people, `--json` for scripts. `end` ends one early (DELETE /api/v1/shaping/effects/{id}), on
every worker and node: for an operator who knows the site takes mail again.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pigeon.cli.api import ApiClient, add_api_options, fail, identifier, printable
from pigeon.cli.common import add_config_option, load_config
from pigeon.config.load import ConfigError, problems, read_text, unbindable_sources
from pigeon.config.patterns import host_port
from pigeon.config.schema import Config
from pigeon.redaction import redact
from pigeon.route_tenants import RouteTenants
from pigeon.smtp.address import a_label

_EXAMPLES = {
    "check": ["pigeon shaping check /etc/pigeon/pigeon.toml"],
    "explain": [
        "pigeon shaping explain gmail.com -c /etc/pigeon/pigeon.toml",
        "pigeon shaping explain customer.example -c /etc/pigeon/pigeon.toml --json",
    ],
    "status": [
        "pigeon shaping status                 # what reactions suspend, limit or bounce now, and until when",
        "pigeon shaping status --json | jq '.effects[] | select(.action == \"suspend\")'",
    ],
    "end": ["pigeon shaping end 3f9a0c1b2d4e       # the site takes mail again: end that effect now"],
}
EXAMPLES = "examples:\n" + "".join(f"  {line}\n" for lines in _EXAMPLES.values() for line in lines)


def _examples(action: str) -> str:
    return "examples:\n" + "".join(f"  {line}\n" for line in _EXAMPLES[action])


if TYPE_CHECKING:
    from pigeon.delivery.routes import Destination
    from pigeon.shaping.rules import Explanation


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "shaping",
        help="shaping: `pigeon shaping check FILE`, `explain DOMAIN`, `status`, `end ID`",
        description="Delivery limits per domain and per provider.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = actions.add_parser(
        "check",
        help="validate a configuration file's [[provider]], [[shaping]] and [[reaction]] blocks (and the rest)",
        description="Validate a configuration file: print every problem with its key and line and exit 1, "
        "or print a short summary and exit 0.",
        epilog=_examples("check"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("file", type=Path, metavar="FILE", help="the TOML configuration file")
    check.set_defaults(run=run_check)
    explain = actions.add_parser(
        "explain",
        help="resolve a domain, print its site, provider and limits with where each came from",
        description="Resolve DOMAIN as the node would ([[route]]s, then MX through [dns] nameservers) and "
        "print its site, its provider, the throttle key, and every limit with the layer it came from.",
        epilog=_examples("explain"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain.add_argument("domain", metavar="DOMAIN", help="a recipient domain")
    add_config_option(explain)
    explain.add_argument("--json", action="store_true", help="print the answer as JSON")
    explain.add_argument("--source", metavar="NAME", help="as sent from this [[source]] (default: the implicit source)")
    explain.add_argument(
        "--queue",
        metavar="NAME",
        help="and the rate of this scheduled queue (campaign:tenant@domain), from its [[queue]] block",
    )
    explain.set_defaults(run=run_explain)
    status = actions.add_parser(
        "status",
        help="live effects of shaping reactions (suspensions, limits, bounces)",
        description="The live effects of shaping reactions on a running node (the whole cluster's with [redis]).",
        epilog=_examples("status"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_api_options(status)
    status.set_defaults(run=run_status)
    end = actions.add_parser(
        "end",
        help="end a shaping reaction's effect early (what it held is started)",
        description="End a live effect of a shaping reaction now, on every worker of the node and, with [redis], "
        "on every node: a suspension's mail is started, a limit lifted, a bounce stopped. The rule may start "
        "a new effect at the next matching reply. Needs a token with the admin scope.",
        epilog=_examples("end"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    end.add_argument("id", metavar="ID", type=identifier, help="the effect's id, as `pigeon shaping status` lists it")
    add_api_options(end)
    end.set_defaults(run=run_end)


def run_check(args: argparse.Namespace) -> int:
    from pigeon.shaping.rules import ShapingRules  # (here: the other commands start faster without it)

    path: Path = args.file
    try:
        read_text(path)
    except ConfigError as error:  # no file to check (missing, unreadable): exit 2, as every command
        print(f"pigeon: configuration error: {redact(str(error))}", file=sys.stderr)
        return 2
    found = problems(path)
    for problem in found:
        print(problem)
    if found:
        print(f"pigeon: {len(found)} problem{'s' if len(found) > 1 else ''} in {path}", file=sys.stderr)
        return 1
    config = load_config(argparse.Namespace(config=path))
    _warn_unbindable_sources(config)
    rules = ShapingRules.from_config(config, path, path.read_text(encoding="utf-8"))
    by_domain = sum(1 for block in config.shaping if block.domain is not None)
    shipped = "on" if config.delivery.provider_defaults else "off ([delivery] provider_defaults = false)"
    print(f"{path}: ok")  # (as `pigeon serve --check` says it)
    print(f"  [[provider]] blocks: {len(config.provider)}; providers known: {len(rules.providers)}")
    by_provider = len(config.shaping) - by_domain
    print(f"  [[shaping]] blocks: {len(config.shaping)} ({by_domain} by domain, {by_provider} by provider)")
    print(f"  shipped provider defaults: {shipped}")
    print(f"  {_reactions_summary(config)}")
    return 0


def _reactions_summary(config: Config) -> str:
    """The `[[reaction]]` blocks, what they do to the shipped rules, and the rules in force."""
    from pigeon.shaping.reactions import effective_rules, shipped_rules

    defaults = config.delivery.default_reactions
    shipped = {rule.id for rule in shipped_rules()} if defaults else set()
    mine = config.reaction
    replacing = sum(1 for rule in mine if rule.id in shipped and rule.enabled)
    off = sum(1 for rule in mine if rule.id in shipped and not rule.enabled)
    disabled = sum(1 for rule in mine if rule.id not in shipped and not rule.enabled)
    parts = [f"{len(mine) - replacing - off - disabled} new", f"{replacing} replacing shipped rules"]
    parts += [f"{off} turning shipped rules off"] + ([f"{disabled} disabled"] if disabled else [])
    in_force = effective_rules(mine, defaults=defaults)
    whose = f"{len(shipped) - replacing - off} shipped" if defaults else "shipped reactions off"
    return f"[[reaction]] blocks: {len(mine)} ({', '.join(parts)}); rules in force: {len(in_force)} ({whose})"


def _warn_unbindable_sources(config: Config) -> None:
    """Each `[[source]]` this machine cannot bind now: said, not refused, as by the running
    node (only the node's own start stops on one): the rest of the file can still be read."""
    for warning in unbindable_sources(config):
        print(f"pigeon: warning: {warning}", file=sys.stderr)


def run_explain(args: argparse.Namespace) -> int:
    from pigeon.delivery.mx import DnsFailure
    from pigeon.shaping.rules import ShapingQuery, ShapingRules

    config = load_config(args)
    _warn_unbindable_sources(config)
    domain = a_label(args.domain.strip().rstrip("."))  # as the node names a recipient's domain
    source: str | None = args.source
    if source is not None and source not in (names := [s.name for s in config.source]):
        print(f"pigeon: no [[source]] called {source!r} (known: {', '.join(names) or 'none'})", file=sys.stderr)
        return 2  # a usage error: a bad option value
    try:
        destination, sts = asyncio.run(_destination(config, domain))
    except DnsFailure as failure:
        reply = failure.reply
        text = printable(f"{domain}: {reply.text}")  # a DNS error's words may carry names it found
        print(f"pigeon: {text} ({reply.code} {reply.enhanced})", file=sys.stderr)
        return 1
    text = args.config.read_text(encoding="utf-8") if args.config is not None else ""
    rules = ShapingRules.from_config(config, args.config, text)
    hosts = tuple(hop.host for hop in destination.hops)
    query = ShapingQuery(domain, destination.site, hosts, source, security=destination.security)
    explanation = rules.explain(query)
    # A [[route]]'s next hop as the route gives it, its port with it (the site has it too):
    # the host alone hides which of a relay's ports the mail goes to.
    next_hop = None
    if destination.hops_from == "route":
        (hop,) = destination.hops
        next_hop = host_port(hop.host, hop.port)
    queue = _queue_rate(config, args.config, text, args.queue) if args.queue is not None else None
    # Whose mail its [[route]] is for (`tenants`): other tenants' is refused and bounced.
    reserved = RouteTenants.from_config(config.route).reserved_for(domain)
    route_tenants = sorted(reserved) if reserved is not None else None
    if args.json:
        extra = {"hosts_from": destination.hops_from, "next_hop": next_hop, "route_tenants": route_tenants} | (
            {"scheduled_queue": queue} if queue else {}
        )
        if sts is not None:
            extra["mta_sts"] = sts or None
        print(json.dumps(explanation.as_dict() | extra, indent=2))
    else:
        _print(explanation, destination.hops_from, next_hop, sts, route_tenants)
        if queue is not None:
            rate = queue["max_message_rate"] or "none"
            print(f"\nscheduled queue {queue['name']}: max_message_rate {rate}  {queue['from']}")
        if source is None and config.source:
            # Each source has its own limits: the implicit source's may not be what mail gets.
            pool = f"[delivery] pool = {config.delivery.pool!r}; " if config.delivery.pool else ""
            sources = ", ".join(s.name for s in config.source)
            print(f"\n(as sent from the implicit source; {pool}--source NAME shows one of: {sources})")
    return 0


def _queue_rate(config: Config, path: Path | None, text: str, name: str) -> dict[str, Any]:
    """The rate of the scheduled queue `name` (its own, whatever its destination: the first
    matching `[[queue]]` block's `max_message_rate`), and the block it came from."""
    from fnmatch import fnmatchcase

    from pigeon.config.load import block_line

    for index, block in enumerate(config.queue):
        if fnmatchcase(name, block.name):
            where = f"{path.name} [[queue]] #{index + 1}" if path is not None else f"[[queue]] #{index + 1}"
            line = block_line(text, "queue", index, "max_message_rate") if text else None
            origin = f"{where} line {line}" if line else where
            return {"name": name, "max_message_rate": block.max_message_rate, "from": f"{origin} (name {block.name!r})"}
    return {"name": name, "max_message_rate": None, "from": "no [[queue]] block matches it"}


async def _destination(config: Config, domain: str) -> tuple[Destination, dict[str, Any] | None]:
    """The destination, as the node works it out under the MTA-STS policy the node has cached
    for the domain (none is looked up or fetched here), and what that policy says of its MX
    hosts: {} when none is cached, None when no policy applies (`[mta_sts] enabled = false`,
    or a route's next hop or an address literal, where the operator chose the host)."""
    from pigeon.delivery.mta_sts_store import PolicyStore
    from pigeon.delivery.mx import Resolver
    from pigeon.delivery.routes import Router, TlsPolicy
    from pigeon.node.outbound import routes_from

    nameservers = [(e.host, e.port) for e in config.dns.nameservers]
    dane = config.dane.enabled  # (its ready queues' names say DANE, as the node's do)
    resolver = Resolver(nameservers or None, timeout=config.dns.timeout, dnssec=dane)
    delivery = config.delivery
    store = (
        PolicyStore(resolver, ca_file=config.mta_sts.ca_file, directory=config.spool.path, cached_only=True)
        if config.mta_sts.enabled
        else None
    )
    router = Router(
        routes_from(config),
        resolver,
        tls=TlsPolicy(delivery.tls),
        smtp_port=delivery.smtp_port,
        mta_sts=store,
        dane=dane,
    )
    destination = await router.destination(domain)
    if store is None or destination.hops_from != "mx":
        return destination, None
    applied = await store.policy(domain)
    if applied is None:
        return destination, {}
    exchangers, _ = await resolver.exchangers_for(domain)  # (every MX host, those it refuses too)
    policy = applied.policy
    expires = store.expires(domain) or 0.0
    return destination, {
        "mode": policy.mode.value,
        "id": applied.policy_id,
        "mx": list(policy.mx),
        "until": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires)),
        "allowed_hosts": [e.host for e in exchangers if policy.allows(e.host)],
        "refused_hosts": [e.host for e in exchangers if not policy.allows(e.host)],
    }


# What the hosts are called, by where they came from, and what "every one of them" is: a
# [[route]]'s next hop (a smart host, a relay) is no MX host, and no MX lookup was made.
_HOSTS: Final = {
    "mx": ("MX hosts", "every MX host"),
    "route": ("next hop", "the [[route]]'s next hop"),
    "literal": ("host", "the address literal's host"),
}


def _print(
    explanation: Explanation,
    hops_from: str = "mx",
    next_hop: str | None = None,
    sts: dict[str, Any] | None = None,
    route_tenants: list[str] | None = None,
) -> None:
    query, provider = explanation.query, explanation.provider
    label, every = _HOSTS[hops_from]
    print(f"domain    {query.domain}")
    print(f"site      {query.site}")
    print(f"{label:10}{next_hop or ' '.join(query.hosts) or '-'}")
    if route_tenants is not None:  # (no line for a route of any tenant's mail: the common case reads as before)
        print(
            f"tenants   {', '.join(route_tenants)} ([[route]] tenants: any other tenant's mail, or none's, is refused)"
        )
    if sts:  # (no line without a policy cached: the common case reads as before)
        print(f"mta-sts   {_describe_policy(sts)}")
    if query.source is not None:
        print(f"source    {query.source}")
    if provider is not None:
        print(f"provider  {provider.name} (MX suffixes: {', '.join(provider.mx_suffixes)})")
    else:
        print(f"provider  none (no provider's MX suffixes cover {every})")
    if "domain:" in explanation.key:
        shared = "this domain's own: its [[shaping]] block sets its own limits"
    elif "provider:" in explanation.key:
        shared = "shared by every domain of the provider"
    elif provider is not None:
        shared = "this site's own: a [[shaping]] domain block sets its own limits"
    else:
        shared = "this site's own"
    if query.source is not None:
        shared += ", from this source"
    print(f"rate key  {explanation.key} ({shared})")
    if explanation.own_queue:
        whose = "its own: a [[shaping]] block names this domain"
    elif query.security:
        # Only domains sent with this TLS policy share it: a [[route]]'s tls, tls_verify or
        # ca_file gives a domain a queue apart from the site's others (Destination.security).
        whose = "shared by the site's domains sent with the same TLS policy that no [[shaping]] block names"
    else:
        whose = "shared by the site's domains that no [[shaping]] block names"
    print(f"queue     {explanation.queue} ({whose})")
    print()
    width = max(len(s.name) for s in explanation.settings)
    values = max(len("value"), *(len(s.text) for s in explanation.settings))  # "32" is narrower than its heading
    print(f"{'setting':{width}}  {'value':{values}}  from")
    for setting in explanation.settings:
        print(f"{setting.name:{width}}  {setting.text:{values}}  {setting.origin}")


def _describe_policy(sts: dict[str, Any]) -> str:
    """The MTA-STS line of `explain`: the cached policy's mode and the MX hosts it allows."""
    allowed = " ".join(sts["allowed_hosts"]) or "none"
    text = f"mode {sts['mode']} (id {sts['id']}, cached until {sts['until']}, mx {', '.join(sts['mx']) or '(none)'})"
    if sts["mode"] == "none":
        return f"{text}: no policy applies"
    refused = sts["refused_hosts"]
    enforced = sts["mode"] == "enforce"
    verb = "would refuse" if not enforced else "refuses"
    text += f": allows {allowed}" + (f"; {verb} {' '.join(refused)}" if refused else "")
    return text + ("; only over TLS verified for the host's name" if enforced else "")


def _left(seconds: float) -> str:
    """Time left as people read it: 45s, 14m30s, 1h05m."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def run_end(args: argparse.Namespace) -> int:
    status, answer = ApiClient(args).request("DELETE", f"/api/v1/shaping/effects/{args.id}")
    if status >= 400:
        return fail(status, answer)
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    answer = printable(answer)
    ended = answer.get("ended")
    if not isinstance(ended, dict):
        return fail(status, {"error": f"the node answered without the effect it ended: {answer}"})
    reach = {
        "cluster": "on every node",
        "node": "on this node's workers (no [redis])",
        "node-local": "on this node; Redis does not answer: the other nodes learn of it when it does",
    }
    print(f"ended {ended['action']} {ended['key']} (effect {ended['id']}, rule {ended['rule']}) "
          f"{reach.get(answer.get('mode', ''), '')}".rstrip())  # fmt: skip
    if ended["action"] == "suspend":
        print("what it held is started now, and what its matching replies deferred to its end is due now")
    return 0


def run_status(args: argparse.Namespace) -> int:
    status, answer = ApiClient(args).request("GET", "/api/v1/shaping/effects")
    if status >= 400:
        return fail(status, answer)
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    answer = printable(answer)  # an effect's reply is the remote server's, as it answered
    reach = {
        "cluster": "shared by the cluster through Redis",
        "node": "this node's (no [redis])",
        "node-local": "Redis does not answer: new effects hold for this node alone",
    }
    print(f"effects: {reach.get(answer.get('mode', ''), answer.get('mode', '?'))}")
    effects = answer.get("effects", [])
    if not effects:
        print("none live")
        return 0
    now = time.time()
    rows = [("id", "action", "key", "ends", "rule", "node", "reply")]
    for effect in effects:
        action = effect["action"]
        if action == "limit":
            lowered = [f"{effect['connection_limit']} conn"] if effect.get("connection_limit") else []
            lowered += [effect["max_message_rate"]] if effect.get("max_message_rate") else []
            action = f"limit {', '.join(lowered)}"
        ends = f"in {_left(effect['expires_at'] - now)}"
        rows.append((effect["id"], action, effect["key"], ends, effect["rule"], effect["node"], effect["reply"]))
    # Columns as wide as their widest cell: a key (a Gmail site) or a limit can be long, and a
    # cut key or a shifted column misleads more than a wide line.
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [
            f"{cell:>{width}}" if column == 3 else f"{cell:{width}}"
            for column, (cell, width) in enumerate(zip(row[:-1], widths, strict=True))
        ]
        print("  ".join([*cells, row[-1]]))
    print(f"(as of {datetime.datetime.fromtimestamp(now, datetime.UTC):%Y-%m-%d %H:%M:%S} UTC)")
    return 0
