"""`[[route]] tenants`: a route reserved for some tenants' mail.

A route says where mail for a domain goes, and may log in to a smart host with an account
(`auth_username`) that belongs to one customer. Without `tenants` any mail whose recipient
domain (or routing domain: a rebind's, a policy's `Reroute`) picks the route goes by it, so
tenant acme sending to `anyone@globex-relay.test` would be carried under globex's account.
With `tenants`, the route is for those tenants' mail alone, and the first route whose domain
matches is the mail's, as always: a reserved route does not make Pigeon look further for
another one. Mail of another tenant, or of none, is

* refused where it arrives, wherever its recipient and tenant are known there (`RCPT` of a
  credential bound to tenants, an HTTP injection's recipient, and at the end of `DATA` or
  an injection's commit, once the policy's `on_message` has given its last word on the
  tenant and the route: `Intake`), with `550 5.7.1`;
* bounced, never sent, when it reaches such a route later (an operator's rebind, a policy's
  `Reroute` in `before_delivery`, a reload that reserved the route): the scheduler asks before
  it makes a message ready (`pigeon.queue.scheduler`), and a reload that changes a route's
  tenants routes again what waits for it.

The replies name the mail's own tenant and the domain, never the tenants the route is for.
This module is shared by the listeners, the intake, the router and `pigeon shaping explain`,
so that one test decides everywhere which route is a domain's.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Final

from pigeon.smtp import replies
from pigeon.smtp.replies import Reply

if TYPE_CHECKING:
    from pigeon.config.schema import RouteConfig

_SHOWN: Final = 60  # characters of a tenant's name a reply shows at most


def route_matches(pattern: str, domain: str) -> bool:
    """Whether a `[[route]]`'s domain glob (lower-cased) matches a routing domain (lower-cased):
    the router's own test (`pigeon.delivery.routes.Route.matches`)."""
    return pattern == "*" or fnmatch.fnmatchcase(domain, pattern)


def matches_everything(pattern: str) -> bool:
    """Whether a route's domain glob matches every domain ("*", "**"): a default route."""
    return bool(pattern) and not pattern.strip("*")


class RouteTenants:
    """Which tenants each `[[route]]` is reserved for, in the routes' order (the first route
    that matches a domain is its route, as for the router)."""

    __slots__ = ("_any", "_routes")

    def __init__(self, routes: Sequence[tuple[str, frozenset[str] | None]] = ()) -> None:
        self._routes = tuple((pattern.lower(), tenants) for pattern, tenants in routes)
        # (Asked for every message and recipient: known once, as the routes never change.)
        self._any = any(tenants is not None for _, tenants in self._routes)

    @classmethod
    def from_config(cls, routes: Sequence[RouteConfig]) -> RouteTenants:
        return cls([(r.domain, frozenset(r.tenants) if r.tenants is not None else None) for r in routes])

    @property
    def any(self) -> bool:
        """Whether some route is reserved (else nothing needs asking)."""
        return self._any

    def reserved_for(self, domain: str) -> frozenset[str] | None:
        """The tenants the route of `domain` is for; None: any tenant's mail (no route, or one
        without `tenants`)."""
        domain = domain.lower()
        for pattern, tenants in self._routes:
            if route_matches(pattern, domain):
                return tenants
        return None

    def refusal(self, domain: str, tenants: Collection[str | None], *, routed: bool = False) -> Reply | None:
        """`550 5.7.1` when no tenant of `tenants` (what the mail's tenant may be: None for none)
        may have its mail go by the route of `domain` (`routed`: the domain the mail is routed
        as, not its recipients'); None when one may, or the route is not reserved."""
        allowed = self.reserved_for(domain) if self._routes else None
        if allowed is None or any(tenant is not None and tenant in allowed for tenant in tenants):
            return None
        return reserved_reply(domain, tenants, routed=routed)


def shared_account_warnings(routes: Sequence[RouteConfig]) -> list[str]:
    """A warning for each `[[route]]` that logs in to the smart host of an earlier one with the
    same account (`next_hop` and `auth_username`) where either is reserved (`tenants`) and they
    are not reserved alike: the mail of tenants the reserved one is not for goes out through
    its customer's account all the same, by the other (found from outside: a second, unreserved
    route for another domain with globex's next hop and user passed `serve --check` without a
    word). Said, not refused: an operator may mean it (an account shared on purpose)."""
    warnings = []
    for later, route in enumerate(routes):
        account = _account(route)
        if account is None:
            continue
        for earlier, first in enumerate(routes[:later]):
            if _account(first) != account or _tenant_set(first) == _tenant_set(route):
                continue
            host, port, username = account
            warnings.append(
                f"[[route]] #{later + 1} (domain {route.domain!r}) logs in to {host}:{port} as {username!r} as "
                f"#{earlier + 1} (domain {first.domain!r}) does, and they are not reserved alike (#{earlier + 1}: "
                f"{_whose(first)}; #{later + 1}: {_whose(route)}): by either, its tenants' mail goes out through "
                "that one account; give them the same tenants, or each an account of its own"
            )
            break
    return warnings


def _account(route: RouteConfig) -> tuple[str, int, str] | None:
    """The smart host account a route logs in with: its next hop and user (None: it logs in to none)."""
    if route.next_hop is None or route.auth_username is None:
        return None
    return route.next_hop.host.lower(), route.next_hop.port, route.auth_username


def _tenant_set(route: RouteConfig) -> frozenset[str] | None:
    return frozenset(route.tenants) if route.tenants is not None else None


def _whose(route: RouteConfig) -> str:
    """Whose mail a route carries, as a warning says it."""
    if route.tenants is None:
        return "any tenant's mail, or none's"
    names = sorted(route.tenants)
    return f"tenant {names[0]}'s alone" if len(names) == 1 else f"tenants {', '.join(names)}'s alone"


def reserved_reply(domain: str, tenants: Collection[str | None], *, routed: bool = False) -> Reply:
    """The refusal (and at delivery the bounce) of mail of `tenants` whose route, that of
    `domain`, is reserved for other tenants: it names the mail's own tenant(s), not theirs."""
    named = sorted(_shown(tenant) for tenant in tenants if tenant is not None)
    if not named:
        whose = "mail of no tenant"
    elif len(named) == 1:
        whose = f"mail of tenant {named[0]}"
    else:
        whose = f"mail of tenants {', '.join(named)}" + (" or of none" if None in tenants else "")
    what = f"mail routed as {domain}" if routed else f"mail to {domain}"
    return replies.r(
        550,
        "5.7.1",
        f"{what} goes by a [[route]] reserved for other tenants: {whose} may not be sent through it "
        "(send it as a tenant that route is for, or ask the operator to add yours to its tenants)",
    )


def _shown(tenant: str) -> str:
    """A tenant's name as a reply shows it: printable, and not too long."""
    text = tenant if tenant.isprintable() else tenant.encode("unicode_escape").decode("ascii")
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
