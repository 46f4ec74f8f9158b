"""Lockouts after failed SMTP AUTH: per client address and per user name.

`AuthThrottle` counts failures in a sliding window. Once a client address (an IPv6 client
counts as its /64, which one host usually holds whole) or a user name reaches its limit, it
is locked out for a cooldown: the listener answers its AUTH attempts with 454 4.7.0 without
checking the password, so a guesser learns nothing and costs us no hashing.

The per-user count is kept whichever address the failures came from, so guessing one
password from many addresses is throttled too. A success clears the failures of the
address it came from (a typo), never the user's count (else a brute-forcer would get fresh
guesses every time the real user's client logs in). An address that authenticated as a
user lately is exempt from that user's lockout: it has shown it knows the password, and an
attacker must not be able to lock the user's own clients out.

Checks in progress are held against the allowance: once failures plus checks in progress
reach a limit, a new check is not begun (`InFlight`) until one of them has been counted, so
guesses sent at once on parallel connections never get more checks than the allowance. That
is a wait, not a refusal: the listener asks again when a check ends, and only failures
themselves lock out, so right passwords sent at once (a relay's or an application's pool of
connections) are all checked, a few at a time.

Pure bookkeeping: no I/O, the caller passes the time. Memory is bounded: each table keeps at
most `max_tracked` keys and forgets the one quiet longest; expired keys go as time passes.
State is per process: right for a node of one worker. With several, the listener is given a
`shared_auth_throttle.SharedAuthThrottle` instead, which keeps the same rules in a table the
workers share (`AuthLimits` is what both offer).
"""

from __future__ import annotations

import ipaddress
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from typing import Final, Protocol

KNOWN_GOOD_FOR: Final = 86_400.0
"""Seconds an address that authenticated as a user stays exempt from that user's lockout."""


@dataclass(slots=True)
class _Failures:
    times: deque[float]  # at most `limit` of them: older ones no longer matter
    locked_until: float = 0.0


@dataclass(frozen=True, slots=True)
class Lockout:
    """Why an AUTH attempt is refused unchecked: which key is locked, and until when."""

    kind: str  # "address" or "user"
    key: str
    until: float


@dataclass(frozen=True, slots=True)
class InFlight:
    """Why an AUTH attempt must wait before its check: failures and checks in progress of a key
    together reach its limit, and a check in progress may yet fail. Ask again when one ends."""

    kind: str  # "address" or "user"
    key: str


class AuthLimits(Protocol):
    """What the listener asks of an AUTH throttle, kept in one worker or shared by a node's."""

    def begin(self, address: str, user: str, now: float) -> Lockout | InFlight | None:
        """Before a password check: the lockout that refuses it unchecked, the checks in
        progress it must wait for, or None (then it is pending)."""
        ...

    def abandoned(self, address: str, user: str) -> None:
        """A begun check that never ran."""
        ...

    def failed(self, address: str, user: str, now: float) -> list[Lockout]:
        """Count a wrong password; the lockouts it starts."""
        ...

    def succeeded(self, address: str, user: str, now: float) -> None:
        """Count a right password."""
        ...


class _FailureTable:
    """Failure times per key, oldest-touched first, at most `max_tracked` keys."""

    def __init__(self, limit: int, window: float, cooldown: float, max_tracked: int) -> None:
        self.limit = limit
        self.window = window
        self.cooldown = cooldown
        self.max_tracked = max_tracked
        self._keys: OrderedDict[str, _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def locked_until(self, key: str, now: float) -> float | None:
        entry = self._keys.get(key)
        if entry is None or entry.locked_until <= now:
            return None
        return entry.locked_until

    def fail(self, key: str, now: float) -> bool:
        """Count a failure; True if it starts a lockout."""
        self._expire(now)
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = _Failures(deque(maxlen=self.limit))
            if len(self._keys) > self.max_tracked:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(key)
        times = entry.times
        times.append(now)
        while times and times[0] <= now - self.window:
            times.popleft()
        if len(times) >= self.limit and entry.locked_until <= now:
            entry.locked_until = now + self.cooldown
            times.clear()  # after the cooldown, a fresh allowance
            return True
        return False

    def recent(self, key: str, now: float) -> int:
        """Failures of `key` within the window."""
        entry = self._keys.get(key)
        if entry is None:
            return 0
        return sum(1 for t in entry.times if t > now - self.window)

    def forget(self, key: str) -> None:
        self._keys.pop(key, None)

    def _expire(self, now: float) -> None:
        # The front was touched longest ago: stop at the first key that still matters.
        keys = self._keys
        while keys:
            key, entry = next(iter(keys.items()))
            if entry.locked_until > now or (entry.times and entry.times[-1] > now - self.window):
                break
            del keys[key]


class AuthThrottle:
    """Failed-AUTH counts per client address and per user name, and the lockouts they cause.

    A limit of 0 turns that count off.
    """

    def __init__(
        self,
        *,
        per_address: int,
        per_user: int,
        window: float,
        cooldown: float,
        max_tracked: int = 10_000,
    ) -> None:
        self._addresses = _FailureTable(per_address, window, cooldown, max_tracked)
        self._users = _FailureTable(per_user, window, cooldown, max_tracked)
        self._known_good: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._max_tracked = max_tracked
        # Checks begun and not yet counted, per client and per user: each may turn out a
        # failure, so a new check waits while they would take the allowance (many guesses sent
        # at once, on parallel connections, would otherwise all be checked before the first
        # is counted).
        self._pending_clients: Counter[str] = Counter()
        self._pending_users: Counter[str] = Counter()

    @property
    def tracked(self) -> int:
        """Keys held in memory, over all tables."""
        return len(self._addresses) + len(self._users) + len(self._known_good)

    def refusal(self, address: str, user: str, now: float) -> Lockout | None:
        """The lockout that refuses this attempt without a password check, or None to check it."""
        client = client_key(address)
        if self._addresses.limit:
            until = self._addresses.locked_until(client, now)
            if until is not None:
                return Lockout("address", client, until)
        if self._users.limit:
            until = self._users.locked_until(user, now)
            if until is not None and not self._is_known_good(user, client, now):
                return Lockout("user", user, until)
        return None

    def begin(self, address: str, user: str, now: float) -> Lockout | InFlight | None:
        """Before a password check: the lockout that refuses it unchecked; or `InFlight` when
        failures and checks in progress together reach a limit (each of those may yet fail:
        checked now, it could be one failure too many), to ask again when one has been counted;
        or None, and then the check is pending until `failed`, `succeeded` or `abandoned`
        counts it."""
        lockout = self.refusal(address, user, now)
        if lockout is not None:
            return lockout
        client = client_key(address)
        table = self._addresses
        if table.limit:
            failures = table.recent(client, now)
            if failures >= table.limit:
                return Lockout("address", client, now)
            if failures + self._pending_clients[client] >= table.limit:
                return InFlight("address", client)
        table = self._users
        if table.limit and not self._is_known_good(user, client, now):
            failures = table.recent(user, now)
            if failures >= table.limit:
                return Lockout("user", user, now)
            if failures + self._pending_users[user] >= table.limit:
                return InFlight("user", user)
        self._pending_clients[client] += 1
        self._pending_users[user] += 1
        return None

    def abandoned(self, address: str, user: str) -> None:
        """A begun check that never ran."""
        self._settle(client_key(address), user)

    def _settle(self, client: str, user: str) -> None:
        for pending, key in ((self._pending_clients, client), (self._pending_users, user)):
            pending[key] -= 1
            if pending[key] <= 0:
                del pending[key]

    def failed(self, address: str, user: str, now: float) -> list[Lockout]:
        """Count a wrong password; returns the lockouts this failure starts (to be logged)."""
        client = client_key(address)
        if client in self._pending_clients:
            self._settle(client, user)
        started = []
        if self._addresses.limit and self._addresses.fail(client, now):
            started.append(Lockout("address", client, now + self._addresses.cooldown))
        if self._users.limit and self._users.fail(user, now):
            started.append(Lockout("user", user, now + self._users.cooldown))
        return started

    def succeeded(self, address: str, user: str, now: float) -> None:
        """A right password: forgive this address its failures and exempt it from `user`'s lockout."""
        client = client_key(address)
        if client in self._pending_clients:
            self._settle(client, user)
        self._addresses.forget(client)
        known = self._known_good
        pair = (user, client)
        known[pair] = now + KNOWN_GOOD_FOR
        known.move_to_end(pair)
        while known and (len(known) > self._max_tracked or next(iter(known.values())) <= now):
            known.popitem(last=False)

    def _is_known_good(self, user: str, client: str, now: float) -> bool:
        until = self._known_good.get((user, client))
        return until is not None and until > now


def client_key(address: str) -> str:
    """What one client is: its IPv4 address, or the /64 of its IPv6 address."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address  # not an IP (a Unix socket, say): count it as given
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
