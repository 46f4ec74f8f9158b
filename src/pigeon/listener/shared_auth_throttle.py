"""AUTH lockouts for a node of several workers: `AuthThrottle`'s rules, kept in the client table.

The same rules as `auth_throttle.AuthThrottle` (read its docstring), with the counts in the
node's client table (`client_table`) rather than in one worker's memory, so that a guesser
whose connections land on different workers gets the node's allowance, not one per worker.
Each call is one decision under the table's lock: a check begun on one worker counts against
the allowance on every other at once.

Differences from the in-memory tables, both on the strict side: a failure counts for the
window and at most `window / BUCKETS` longer (time is counted in buckets); and when the
table cannot make room for a key (every slot of its window holds an open connection or a
check in progress, see `client_table`), that key's attempts are checked but not counted,
with a warning once. The table forgets the quietest key of a window when a flood of new
ones needs room, as the in-memory tables forget the quietest key of all.
"""

from __future__ import annotations

import logging

from pigeon.listener.auth_throttle import KNOWN_GOOD_FOR, InFlight, Lockout, client_key
from pigeon.listener.client_table import ClientTable

_log = logging.getLogger(__name__)


class SharedAuthThrottle:
    """Failed-AUTH counts per client address and per user name for the whole node.

    A limit of 0 turns that count off. Times passed in are the caller's clock (the loop's);
    the table keeps its own (`ClientTable.now`, system-wide), and lockouts come back in the caller's.
    """

    def __init__(self, table: ClientTable, *, per_address: int, per_user: int, cooldown: float) -> None:
        self._table = table
        self._per_address = per_address
        self._per_user = per_user
        self._cooldown = cooldown
        self._warned = False

    def refusal(self, address: str, user: str, now: float) -> Lockout | None:
        """The lockout that refuses this attempt without a password check, or None to check it."""
        client = client_key(address)
        with self._table.locked():
            return self._refusal(client, user, now, self._table.now())

    def begin(self, address: str, user: str, now: float) -> Lockout | InFlight | None:
        """Before a password check: the lockout that refuses it unchecked; or `InFlight` when
        failures and checks in progress on any worker together reach a limit, to ask again
        later; or None, and then the check is pending until `failed`, `succeeded` or
        `abandoned` counts it."""
        client = client_key(address)
        table = self._table
        t = self._table.now()
        with table.locked():
            lockout = self._refusal(client, user, now, t)
            if lockout is not None:
                return lockout
            by_address = self._slot("a:" + client, self._per_address, t)
            if by_address is not None:
                failures = table.failures(by_address, t)
                if failures >= self._per_address:
                    return Lockout("address", client, now)
                if failures + table.held(by_address) >= self._per_address:
                    return InFlight("address", client)
            by_user = self._slot("u:" + user, self._per_user, t)
            if by_user is not None and not self._is_known_good(user, client, t):
                failures = table.failures(by_user, t)
                if failures >= self._per_user:
                    return Lockout("user", user, now)
                if failures + table.held(by_user) >= self._per_user:
                    return InFlight("user", user)
            for slot in (by_address, by_user):
                if slot is not None:
                    table.hold(slot, t)
        return None

    def abandoned(self, address: str, user: str) -> None:
        """A begun check that never ran."""
        client = client_key(address)
        t = self._table.now()
        with self._table.locked():
            self._settle(client, user, t)

    def failed(self, address: str, user: str, now: float) -> list[Lockout]:
        """Count a wrong password; returns the lockouts this failure starts (to be logged)."""
        client = client_key(address)
        table = self._table
        t = self._table.now()
        started = []
        with table.locked():
            for kind, key, limit in (("address", client, self._per_address), ("user", user, self._per_user)):
                slot = self._slot(kind[0] + ":" + key, limit, t)
                if slot is None:
                    continue
                table.let_go(slot)
                table.fail(slot, t)
                if table.failures(slot, t) >= limit and table.until(slot) <= t:
                    table.set_until(slot, t + self._cooldown, t)
                    table.clear_failures(slot, t)  # after the cooldown, a fresh allowance
                    started.append(Lockout(kind, key, now + self._cooldown))
        return started

    def succeeded(self, address: str, user: str, now: float) -> None:
        """A right password: forgive this address its failures and exempt it from `user`'s lockout."""
        client = client_key(address)
        table = self._table
        t = self._table.now()
        with table.locked():
            self._settle(client, user, t)
            by_address = self._slot("a:" + client, self._per_address, t, create=False)
            if by_address is not None:
                table.clear_failures(by_address, t, lockout=True)
            if self._per_user:  # the exemption matters only to a user lockout
                pair = self._slot(_pair(user, client), 1, t)
                if pair is not None:
                    table.set_until(pair, t + KNOWN_GOOD_FOR, t)

    # --- under the lock ----------------------------------------------------------------------
    def _refusal(self, client: str, user: str, now: float, t: float) -> Lockout | None:
        table = self._table
        by_address = self._slot("a:" + client, self._per_address, t, create=False)
        if by_address is not None and table.until(by_address) > t:
            return Lockout("address", client, now + table.until(by_address) - t)
        by_user = self._slot("u:" + user, self._per_user, t, create=False)
        if by_user is not None and table.until(by_user) > t and not self._is_known_good(user, client, t):
            return Lockout("user", user, now + table.until(by_user) - t)
        return None

    def _settle(self, client: str, user: str, t: float) -> None:
        for key, limit in (("a:" + client, self._per_address), ("u:" + user, self._per_user)):
            slot = self._slot(key, limit, t, create=False)
            if slot is not None:
                self._table.let_go(slot)

    def _is_known_good(self, user: str, client: str, t: float) -> bool:
        pair = self._slot(_pair(user, client), 1, t, create=False)
        return pair is not None and self._table.until(pair) > t

    def _slot(self, key: str, limit: int, t: float, *, create: bool = True) -> int | None:
        """`key`'s slot if its limit is on; None when off or (with `create`) no room."""
        if not limit:
            return None
        slot = self._table.find(key, t, create=create)
        if slot is None and create and not self._warned:
            self._warned = True
            _log.warning("client table full: AUTH failures for %s are not counted", key)
        return slot


def _pair(user: str, client: str) -> str:
    return "k:" + user + "\0" + client
