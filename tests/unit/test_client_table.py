"""The client table a node's SMTP workers share: connections per client and AUTH lockouts
hold for the node, a restarted worker's leftovers are dropped, and the table stays its size.

Two `ClientTable`s on one file are two workers (each opens the file itself, so each has its
own flock, as two processes would). The tables run on a fake clock the test turns.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pigeon.listener.auth_throttle import AuthLimits, AuthThrottle, InFlight, Lockout
from pigeon.listener.client_table import BUCKETS, ClientTable, create_client_table
from pigeon.listener.connection_limits import WORKER, Held, LocalConnections, SharedConnections
from pigeon.listener.shared_auth_throttle import SharedAuthThrottle

WINDOW = 64.0  # buckets of 4 s


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _tables(path: Path, count: int, clock: Clock, slots: int = 1024) -> list[ClientTable]:
    create_client_table(path, slots)
    return [ClientTable(path, index, window=WINDOW, clock=clock) for index in range(count)]


def _throttles(tables: list[ClientTable], *, per_address: int = 3, per_user: int = 5) -> list[SharedAuthThrottle]:
    return [SharedAuthThrottle(t, per_address=per_address, per_user=per_user, cooldown=30) for t in tables]


# --- connections per client ---------------------------------------------------------------------
def _in_table(held: Held | None) -> bool:
    return held is not None and held != WORKER


def test_a_client_gets_the_limit_from_the_node_whichever_worker_takes_its_connections(tmp_path: Path) -> None:
    first, second = (SharedConnections(t, 2) for t in _tables(tmp_path / "clients", 2, Clock()))
    opened = [side.open("192.0.2.1", 3) for side in (first, second, first, second, first, second)]
    assert [_in_table(held) for held in opened] == [True, True, True, False, False, False]
    assert opened[3:] == [None, None, None]
    assert first.count("192.0.2.1") == second.count("192.0.2.1") == 3
    assert _in_table(second.open("192.0.2.2", 3))  # another client has its own allowance

    held = opened[0]
    assert held is not None
    first.close("192.0.2.1", held)
    assert _in_table(second.open("192.0.2.1", 3))
    assert second.open("192.0.2.1", 3) is None


@pytest.mark.parametrize("shared", [False, True], ids=["one worker", "two workers"])
def test_an_ipv6_client_is_its_64_for_the_connection_limit_and_a_mapped_ipv4_its_ipv4(
    tmp_path: Path, shared: bool
) -> None:
    """One host usually holds a whole /64: six of its addresses are one client, as for the AUTH
    lockouts; another /64 is another client; ::ffff:192.0.2.1 is 192.0.2.1."""
    if shared:
        first, second = (SharedConnections(t, 2) for t in _tables(tmp_path / "clients", 2, Clock()))
        sides: list[LocalConnections | SharedConnections] = [first, second]
    else:
        sides = [LocalConnections()]
    opened = [sides[n % len(sides)].open(f"2001:db8::{n + 1}", 2) for n in range(6)]
    assert [held is not None for held in opened] == [True, True, False, False, False, False]
    assert sides[0].count("2001:db8::ffff:1") == 2
    assert sides[-1].open("2001:db8:0:1::1", 2) is not None  # the next /64

    held = opened[0]
    assert held is not None
    sides[0].close("2001:db8::1", held)  # closed under its own address, counted under the /64
    assert sides[-1].open("2001:db8::9", 2) is not None
    assert sides[0].open("2001:db8::a", 2) is None

    assert sides[0].open("192.0.2.1", 1) is not None
    assert sides[-1].open("::ffff:192.0.2.1", 1) is None


def test_a_restarted_worker_leaves_nothing_counted_of_its_dead_self(tmp_path: Path) -> None:
    clock = Clock()
    first, second = _tables(tmp_path / "clients", 2, clock)
    dead, living = SharedConnections(first, 2), SharedConnections(second, 2)
    assert all(_in_table(dead.open("192.0.2.1", 4)) for _ in range(3))
    assert _in_table(living.open("192.0.2.1", 4))
    assert living.open("192.0.2.1", 4) is None

    # kill -9: no close() for its three; the supervisor starts worker 0 again.
    restarted = SharedConnections(ClientTable(tmp_path / "clients", 0, window=WINDOW, clock=clock), 2)
    assert living.count("192.0.2.1") == 1
    assert [_in_table(restarted.open("192.0.2.1", 4)) for _ in range(4)] == [True] * 3 + [False]


def test_a_close_after_the_restart_does_not_free_another_workers_connection(tmp_path: Path) -> None:
    clock = Clock()
    first, second = _tables(tmp_path / "clients", 2, clock)
    old, living = SharedConnections(first, 2), SharedConnections(second, 2)
    held = old.open("192.0.2.1", 2)
    living.open("192.0.2.1", 2)
    ClientTable(tmp_path / "clients", 0, window=WINDOW, clock=clock)  # worker 0 again
    assert held is not None
    old.close("192.0.2.1", held)  # (a late close of the old handle must not take living's)
    assert living.count("192.0.2.1") == 1


def test_a_full_window_falls_back_to_the_workers_share_of_the_limit(tmp_path: Path) -> None:
    # A table of 16 slots is one window: 16 clients with open connections fill it.
    first, second = (SharedConnections(t, 2) for t in _tables(tmp_path / "clients", 2, Clock(), slots=16))
    held = [first.open(f"192.0.2.{i}", 4) for i in range(16)]
    assert all(_in_table(h) for h in held)
    assert [first.open("198.51.100.1", 4) for _ in range(3)] == [WORKER, WORKER, None]
    first.close("198.51.100.1", WORKER)
    assert first.open("198.51.100.1", 4) == WORKER
    assert held[0] is not None
    first.close("192.0.2.0", held[0])  # room again: the newcomer is counted for the node
    assert _in_table(second.open("198.51.100.2", 4))


def test_the_table_keeps_its_size_under_a_flood_of_client_addresses(tmp_path: Path) -> None:
    clock = Clock()
    (table,) = _tables(tmp_path / "clients", 1, clock, slots=256)
    connections = SharedConnections(table, 2)
    (throttle,) = _throttles([table], per_address=3, per_user=3)
    size = (tmp_path / "clients").stat().st_size
    for i in range(5_000):
        address = f"10.0.{i >> 8 & 255}.{i & 255}"
        held = connections.open(address, 1)
        assert _in_table(held)
        assert held is not None
        throttle.failed(address, f"name{i}", clock.t)
        connections.close(address, held)
        clock.t += 0.001
    assert (tmp_path / "clients").stat().st_size == size
    # The newest keys are there (the quietest were forgotten to make room): two more failures lock out.
    assert throttle.failed("10.0.19.135", "x", clock.t) == []
    assert throttle.failed("10.0.19.135", "y", clock.t) == [Lockout("address", "10.0.19.135", clock.t + 30)]


# --- AUTH lockouts: the same rules as in one worker's memory --------------------------------------
Make = Callable[[int, int], tuple[AuthLimits, AuthLimits, Clock]]


@pytest.fixture(params=["memory", "shared"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Make:
    """Two workers' throttles: the same object in memory (one worker), or two on one table."""

    def two(per_address: int, per_user: int) -> tuple[AuthLimits, AuthLimits, Clock]:
        clock = Clock()
        if request.param == "memory":
            one = AuthThrottle(per_address=per_address, per_user=per_user, window=WINDOW, cooldown=30)
            return one, one, clock
        first, second = _throttles(_tables(tmp_path / "clients", 2, clock), per_address=per_address, per_user=per_user)
        return first, second, clock

    return two


def test_failures_on_either_worker_lock_the_address_out_after_the_limit(make: Make) -> None:
    first, second, clock = make(3, 100)
    assert first.failed("192.0.2.1", "a", clock.t) == []
    assert second.failed("192.0.2.1", "b", clock.t) == []
    assert first.failed("192.0.2.1", "c", clock.t) == [Lockout("address", "192.0.2.1", clock.t + 30)]
    clock.t += 1
    assert second.begin("192.0.2.1", "d", clock.t) == Lockout("address", "192.0.2.1", clock.t + 29)
    assert first.begin("192.0.2.2", "d", clock.t) is None


def test_the_lockout_ends_after_the_cooldown_with_a_fresh_allowance(make: Make) -> None:
    first, second, clock = make(2, 100)
    first.failed("192.0.2.1", "a", clock.t)
    second.failed("192.0.2.1", "a", clock.t)
    clock.t += 29.9
    assert second.begin("192.0.2.1", "a", clock.t) is not None
    clock.t += 0.1
    assert second.begin("192.0.2.1", "a", clock.t) is None
    assert second.failed("192.0.2.1", "a", clock.t) == []


def test_checks_in_progress_on_one_worker_make_a_check_on_the_other_wait(make: Make) -> None:
    first, second, clock = make(3, 100)
    assert first.begin("192.0.2.1", "alice", clock.t) is None
    assert second.begin("192.0.2.1", "alice", clock.t) is None
    assert first.begin("192.0.2.1", "alice", clock.t) is None
    assert second.begin("192.0.2.1", "alice", clock.t) == InFlight("address", "192.0.2.1")
    second.abandoned("192.0.2.1", "alice")  # (second's one check never ran)
    assert second.begin("192.0.2.1", "alice", clock.t) is None


def test_right_passwords_in_progress_on_both_workers_never_lock_out(make: Make) -> None:
    first, second, clock = make(3, 100)
    sides = [first, second, first]
    for side in sides:
        assert side.begin("192.0.2.1", "alice", clock.t) is None
    assert second.begin("192.0.2.1", "alice", clock.t) == InFlight("address", "192.0.2.1")
    for side in sides:
        side.succeeded("192.0.2.1", "alice", clock.t)
    assert [side.begin("192.0.2.1", "alice", clock.t) for side in sides] == [None] * 3


def test_an_ipv6_client_is_counted_by_its_slash_64_on_every_worker(make: Make) -> None:
    first, second, clock = make(3, 100)
    for host, side in zip(range(3), (first, second, first), strict=True):
        side.failed(f"2001:db8:1:2::{host + 1:x}", "a", clock.t)
    assert second.begin("2001:db8:1:2:ffff::9", "b", clock.t) == Lockout("address", "2001:db8:1:2::/64", clock.t + 30)
    assert second.begin("2001:db8:1:3::1", "b", clock.t) is None


def test_a_success_on_one_worker_forgives_the_address_but_not_the_user(make: Make) -> None:
    first, second, clock = make(2, 3)
    first.failed("192.0.2.1", "alice", clock.t)
    second.failed("192.0.2.2", "alice", clock.t)
    second.succeeded("192.0.2.2", "alice", clock.t)
    assert first.failed("192.0.2.2", "alice", clock.t) == [Lockout("user", "alice", clock.t + 30)]
    assert second.begin("192.0.2.9", "alice", clock.t) == Lockout("user", "alice", clock.t + 30)
    # 192.0.2.2 logged in as alice (on the second worker): the first lets it in all the same.
    assert first.begin("192.0.2.2", "alice", clock.t) is None


# --- the shared table's own time keeping ----------------------------------------------------------
def test_a_failure_counts_for_the_window_and_at_most_one_bucket_longer(tmp_path: Path) -> None:
    clock = Clock()
    first, second = _throttles(_tables(tmp_path / "clients", 2, clock), per_address=2, per_user=100)
    first.failed("192.0.2.1", "a", clock.t)
    clock.t += WINDOW  # still counted: the lockout comes with the next failure
    assert second.failed("192.0.2.1", "a", clock.t) == [Lockout("address", "192.0.2.1", clock.t + 30)]

    clock.t += 100
    first.failed("192.0.2.1", "a", clock.t)
    clock.t += WINDOW + WINDOW / BUCKETS  # gone: a fresh failure does not lock out
    assert second.failed("192.0.2.1", "a", clock.t) == []


def test_a_flood_of_guessers_forgets_the_quietest_address_first(tmp_path: Path) -> None:
    clock = Clock()
    (throttle,) = _throttles(_tables(tmp_path / "clients", 1, clock, slots=16), per_address=2, per_user=0)
    throttle.failed("192.0.2.1", "a", clock.t)
    for i in range(2, 17):
        clock.t += 0.1
        throttle.failed(f"192.0.2.{i}", "a", clock.t)
    clock.t += 0.1
    throttle.failed("198.51.100.1", "a", clock.t)  # no room: 192.0.2.1, the quietest, goes
    assert throttle.failed("192.0.2.1", "a", clock.t) == []  # (and makes 192.0.2.2 go)
    assert throttle.failed("192.0.2.3", "a", clock.t) == [Lockout("address", "192.0.2.3", clock.t + 30)]


def test_a_checks_user_key_never_takes_the_slot_its_address_key_just_found(tmp_path: Path) -> None:
    # One slot: every key hashes to it, as two keys of one check sometimes do in a big table.
    # The user key finds no room (and is not counted); the address key keeps its count.
    clock = Clock()
    (throttle,) = _throttles(_tables(tmp_path / "clients", 1, clock, slots=1), per_address=3, per_user=100)
    for _ in range(3):
        assert throttle.begin("192.0.2.1", "alice", clock.t) is None
    assert throttle.begin("192.0.2.1", "alice", clock.t) == InFlight("address", "192.0.2.1")
