"""Password checks run on the checker's own threads, and no more than `max_waiting` at once."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pigeon.listener.password_checker import CheckerBusy, PasswordChecker
from pigeon.listener.passwords import PasswordFile, hash_password

FAST = {"n": 2**10, "r": 8, "p": 1}


class _ObservedPasswords(PasswordFile):
    """A real users file that notes which thread checked, and can hold checks back."""

    def __init__(self) -> None:
        super().__init__({"alice": hash_password("secret", **FAST)})
        self.threads: list[str] = []
        self.release = threading.Event()
        self.release.set()

    def check(self, username: str, password: str) -> bool:
        self.threads.append(threading.current_thread().name)
        self.release.wait(10)
        return super().check(username, password)


async def test_passwords_are_hashed_on_the_checkers_own_threads() -> None:
    passwords = _ObservedPasswords()
    checker = PasswordChecker(threads=2)
    try:
        assert await checker.check(passwords, "alice", "secret") is True
        assert await checker.check(passwords, "alice", "wrong") is False
    finally:
        checker.close()
    assert len(passwords.threads) == 2
    assert all(name.startswith("pigeon-auth") for name in passwords.threads), passwords.threads


async def test_checks_beyond_max_waiting_are_refused_until_one_finishes() -> None:
    passwords = _ObservedPasswords()
    passwords.release.clear()
    checker = PasswordChecker(threads=1, max_waiting=2)
    try:
        first = checker.check(passwords, "alice", "secret")
        second = checker.check(passwords, "alice", "wrong")
        with pytest.raises(CheckerBusy):
            checker.check(passwords, "alice", "secret")
        passwords.release.set()
        assert list(await asyncio.gather(first, second)) == [True, False]
        assert checker.outstanding == 0
        assert await checker.check(passwords, "alice", "secret") is True
    finally:
        passwords.release.set()
        checker.close()
