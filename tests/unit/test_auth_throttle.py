"""The failed-AUTH bookkeeping: what locks out, for how long, and that memory stays bounded."""

from __future__ import annotations

from pigeon.listener.auth_throttle import AuthThrottle, InFlight, Lockout


def _throttle(*, per_address: int = 3, per_user: int = 5, max_tracked: int = 10_000) -> AuthThrottle:
    return AuthThrottle(per_address=per_address, per_user=per_user, window=60, cooldown=30, max_tracked=max_tracked)


def test_failures_spread_beyond_the_window_do_not_lock_out() -> None:
    throttle = _throttle()
    for minute in range(10):
        assert throttle.failed("192.0.2.1", f"user{minute}", minute * 31.0) == []
    assert throttle.refusal("192.0.2.1", "user0", 310.0) is None


def test_the_lockout_ends_after_the_cooldown() -> None:
    throttle = _throttle()
    throttle.failed("192.0.2.1", "a", 0.0)
    throttle.failed("192.0.2.1", "b", 1.0)
    assert throttle.failed("192.0.2.1", "c", 2.0) == [Lockout("address", "192.0.2.1", 32.0)]
    assert throttle.refusal("192.0.2.1", "d", 31.9) == Lockout("address", "192.0.2.1", 32.0)
    assert throttle.refusal("192.0.2.1", "d", 32.0) is None


def test_an_ipv6_client_is_counted_by_its_slash_64() -> None:
    throttle = _throttle()
    for host in range(3):
        throttle.failed(f"2001:db8:1:2::{host + 1:x}", "a", 0.0)
    assert throttle.refusal("2001:db8:1:2:ffff::9", "b", 1.0) == Lockout("address", "2001:db8:1:2::/64", 30.0)
    assert throttle.refusal("2001:db8:1:3::1", "b", 1.0) is None


def test_a_success_forgives_the_address_but_not_the_user() -> None:
    throttle = _throttle(per_address=2, per_user=3)
    throttle.failed("192.0.2.1", "alice", 0.0)
    throttle.failed("192.0.2.2", "alice", 0.0)
    throttle.succeeded("192.0.2.2", "alice", 1.0)
    assert throttle.failed("192.0.2.2", "alice", 2.0) == [Lockout("user", "alice", 32.0)]
    assert throttle.refusal("192.0.2.9", "alice", 3.0) == Lockout("user", "alice", 32.0)


def test_memory_stays_bounded_under_a_flood_of_addresses_and_names() -> None:
    throttle = _throttle(max_tracked=100)
    for i in range(10_000):
        throttle.failed(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", f"name{i}", i / 1000)
        throttle.succeeded(f"10.1.{i >> 8 & 255}.{i & 255}", f"name{i}", i / 1000)
    assert throttle.tracked <= 300


def test_quiet_keys_are_forgotten_once_their_window_has_passed() -> None:
    throttle = _throttle()
    for i in range(50):
        throttle.failed(f"192.0.2.{i}", f"name{i}", 0.0)
    throttle.failed("198.51.100.1", "late", 61.0)
    assert throttle.tracked == 2


def test_a_check_waits_while_checks_in_progress_could_take_the_allowance() -> None:
    throttle = AuthThrottle(per_address=3, per_user=100, window=60, cooldown=60)
    assert [throttle.begin("192.0.2.1", "alice", 0) for _ in range(3)] == [None] * 3
    assert throttle.begin("192.0.2.1", "alice", 0) == InFlight("address", "192.0.2.1")
    throttle.succeeded("192.0.2.1", "alice", 1)  # one was right: the address is forgiven
    assert throttle.begin("192.0.2.1", "alice", 1) is None
    throttle.abandoned("192.0.2.1", "alice")


def test_only_failures_lock_out_a_check_that_waited() -> None:
    throttle = AuthThrottle(per_address=3, per_user=100, window=60, cooldown=60)
    for _ in range(3):
        throttle.begin("192.0.2.1", "alice", 0)
    throttle.failed("192.0.2.1", "alice", 1)
    throttle.failed("192.0.2.1", "alice", 1)
    assert throttle.begin("192.0.2.1", "alice", 1) == InFlight("address", "192.0.2.1")  # two failures, one pending
    assert throttle.failed("192.0.2.1", "alice", 2) == [Lockout("address", "192.0.2.1", 62)]
    assert throttle.begin("192.0.2.1", "alice", 2) == Lockout("address", "192.0.2.1", 62)


def test_a_user_s_checks_in_progress_make_others_wait_but_not_its_known_clients() -> None:
    throttle = AuthThrottle(per_address=100, per_user=2, window=60, cooldown=60)
    assert throttle.begin("192.0.2.1", "alice", 0) is None
    throttle.succeeded("192.0.2.1", "alice", 0)  # alice's own client
    assert throttle.begin("192.0.2.2", "alice", 1) is None
    assert throttle.begin("192.0.2.3", "alice", 1) is None
    assert throttle.begin("192.0.2.4", "alice", 1) == InFlight("user", "alice")
    assert throttle.begin("192.0.2.1", "alice", 1) is None
