"""Failed SMTP AUTH locks out the client address, and the user name, for a cooldown.

A real Pigeon, real SMTP over STARTTLS; clients connect from 127.0.0.1, 127.0.0.2 and
127.0.0.3 to be different addresses. A locked-out attempt gets 454 4.7.0 even with the
right password: nothing is checked until the cooldown has passed.
"""

from __future__ import annotations

import base64
import concurrent.futures
import smtplib
import ssl
import time
from pathlib import Path
from typing import Any

from pigeon.listener.passwords import set_password
from tests.support.process import PigeonProcess

PASSWORD = "wonderland"
LOCKED_OUT = (454, b"4.7.0 Too many failed authentication attempts, try again later")
WRONG = (535, b"5.7.8 Authentication credentials invalid")
RIGHT = (235, b"2.7.0 Authentication successful")
# Long enough that the checks made while locked out (each a STARTTLS connection, some an scrypt
# hash) end within it on a loaded machine; a 2 s lockout once ran out before the second one.
LOCKOUT = 6.0
LOCKOUT_SETTING = f"{LOCKOUT:g}s"


def _users_file(root: Path) -> Path:
    users = root / "users"
    root.mkdir(parents=True, exist_ok=True)
    set_password(users, "alice", PASSWORD)  # what `pigeon passwd` writes, without a second process
    return users


def _pigeon(root: Path, **smtp: Any) -> PigeonProcess:
    settings = {"auth_users": str(_users_file(root)), "auth_failure_window": "1m", **smtp}
    return PigeonProcess(root, smtp=settings)


def _auth(pigeon: PigeonProcess, password: str, *, source: str = "127.0.0.1", user: str = "alice") -> tuple[int, bytes]:
    """One AUTH PLAIN attempt on a fresh STARTTLS connection from `source`: the reply."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, source_address=(source, 0), timeout=10) as client:
        client.starttls(context=context)
        client.ehlo()
        token = base64.b64encode(f"\0{user}\0{password}".encode()).decode()
        return client.docmd("AUTH", f"PLAIN {token}")


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def test_repeated_wrong_passwords_lock_the_address_out_even_for_the_right_password(tmp_path: Path) -> None:
    with _pigeon(
        tmp_path, auth_failures_per_address=3, auth_failures_per_user=100, auth_lockout=LOCKOUT_SETTING
    ) as pigeon:
        assert [_auth(pigeon, f"guess-{i}") for i in range(3)] == [WRONG] * 3
        locked_at = time.monotonic()  # (the lockout began before this answer came back)

        assert _auth(pigeon, PASSWORD) == LOCKED_OUT
        assert _auth(pigeon, "guess-4") == LOCKED_OUT
        log = pigeon.stderr()
        assert "WARNING" in log and "AUTH locked out for client 127.0.0.1" in log
        assert "guess-" not in log and PASSWORD not in log

        _sleep_until(locked_at + LOCKOUT + 0.2)
        assert _auth(pigeon, PASSWORD) == RIGHT


def test_another_address_is_not_locked_out_by_the_first_ones_failures(tmp_path: Path) -> None:
    with _pigeon(tmp_path, auth_failures_per_address=3, auth_failures_per_user=100) as pigeon:
        for i in range(3):
            _auth(pigeon, f"guess-{i}")
        assert _auth(pigeon, PASSWORD) == LOCKED_OUT

        assert _auth(pigeon, PASSWORD, source="127.0.0.2") == RIGHT


def test_failures_from_many_addresses_lock_the_user_out_everywhere(tmp_path: Path) -> None:
    with _pigeon(
        tmp_path, auth_failures_per_address=100, auth_failures_per_user=3, auth_lockout=LOCKOUT_SETTING
    ) as pigeon:
        # 127.0.0.3 is alice's own client: it logs in before the attack.
        assert _auth(pigeon, PASSWORD, source="127.0.0.3") == RIGHT
        assert _auth(pigeon, "guess-0", source="127.0.0.1") == WRONG
        assert _auth(pigeon, "guess-1", source="127.0.0.4") == WRONG
        assert _auth(pigeon, "guess-2", source="127.0.0.5") == WRONG
        locked_at = time.monotonic()

        assert _auth(pigeon, PASSWORD, source="127.0.0.2") == LOCKED_OUT
        assert "AUTH locked out for user 'alice'" in pigeon.stderr()
        # An address that proved it knows the password is not locked out by others' guesses,
        # and another user name is not locked out at all.
        assert _auth(pigeon, PASSWORD, source="127.0.0.3") == RIGHT
        assert _auth(pigeon, "anything", source="127.0.0.2", user="bob") == WRONG

        _sleep_until(locked_at + LOCKOUT + 0.2)
        assert _auth(pigeon, PASSWORD, source="127.0.0.2") == RIGHT


def _guess_and_hang_up(pigeon: PigeonProcess, password: str, source: str) -> None:
    """AUTH, then close at once, without waiting for the answer."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    client = smtplib.SMTP("127.0.0.1", pigeon.smtp_port, source_address=(source, 0), timeout=10)
    client.starttls(context=context)
    client.ehlo()
    token = base64.b64encode(f"\0alice\0{password}".encode()).decode()
    client.send(f"AUTH PLAIN {token}\r\n".encode())
    client.close()


def test_guesses_sent_at_once_on_parallel_connections_get_no_more_checks_than_the_allowance(tmp_path: Path) -> None:
    with (
        _pigeon(tmp_path, auth_failures_per_address=5, auth_failures_per_user=1000, auth_lockout="1m") as pigeon,
        concurrent.futures.ThreadPoolExecutor(40) as pool,
    ):
        answers = list(pool.map(lambda i: _auth(pigeon, f"guess-{i}", source="127.0.0.4"), range(40)))
    assert answers.count(WRONG) <= 5, answers
    assert answers.count(WRONG) + answers.count(LOCKED_OUT) == 40


def test_a_guesser_that_hangs_up_after_auth_is_counted_all_the_same(tmp_path: Path) -> None:
    with _pigeon(tmp_path, auth_failures_per_address=3, auth_failures_per_user=1000, auth_lockout="1m") as pigeon:
        for i in range(6):
            _guess_and_hang_up(pigeon, f"guess-{i}", "127.0.0.5")
        time.sleep(1)  # the checks finish after their clients left
        assert _auth(pigeon, PASSWORD, source="127.0.0.5") == LOCKED_OUT
