"""Right passwords sent at once from one client address are all accepted; wrong ones still get
no more checks than `auth_failures_per_address`.

A relay with SASL (Postfix opens 20 connections to its relayhost) or an application's pool
after a restart logs in on many connections at the same moment. Checks in progress hold the
address's allowance (so that guesses sent at once cannot all be checked), but a login beyond
it waits for them to be counted rather than being told it failed too often.

A real Pigeon of one and of two workers (the counts are the node's), real SMTP over STARTTLS
from 127.0.0.9, outside `relay_networks`. Every connection is made ready (EHLO, STARTTLS,
EHLO) before any sends its AUTH, and a barrier lets them all go together.
"""

from __future__ import annotations

import base64
import concurrent.futures
import smtplib
import ssl
import threading
from pathlib import Path

import pytest

from pigeon.listener.passwords import set_password
from tests.support.process import PigeonProcess

CLIENT = "127.0.0.9"
PASSWORD = "wonderland"
CONNECTIONS = 30  # the default `auth_failures_per_address` is 10
RIGHT = (235, b"2.7.0 Authentication successful")
WRONG = (535, b"5.7.8 Authentication credentials invalid")
LOCKED_OUT = (454, b"4.7.0 Too many failed authentication attempts, try again later")
WORKERS = pytest.mark.parametrize("workers", [1, 2], ids=["one worker", "two workers"])


def _pigeon(root: Path, workers: int) -> PigeonProcess:
    users = root / "users"
    root.mkdir(parents=True, exist_ok=True)
    set_password(users, "alice", PASSWORD)
    smtp = {"auth_users": str(users), "relay_networks": ["192.0.2.0/24"], "auth_lockout": "1m"}
    return PigeonProcess(root / "node", node={"workers": workers}, smtp=smtp)


def _all_at_once(port: int, passwords: list[str]) -> list[tuple[int, bytes]]:
    """One STARTTLS connection from CLIENT per password, each made ready before any sends its
    AUTH PLAIN as alice; then all send it together. The replies, in order."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    ready = threading.Barrier(len(passwords), timeout=60)

    def login(password: str) -> tuple[int, bytes]:
        with smtplib.SMTP("127.0.0.1", port, source_address=(CLIENT, 0), timeout=60) as client:
            client.ehlo()
            client.starttls(context=context)
            client.ehlo()
            token = base64.b64encode(f"\0alice\0{password}".encode()).decode()
            ready.wait()
            return client.docmd("AUTH", f"PLAIN {token}")

    with concurrent.futures.ThreadPoolExecutor(len(passwords)) as pool:
        return list(pool.map(login, passwords))


@WORKERS
def test_right_passwords_sent_at_once_from_one_address_are_all_accepted(tmp_path: Path, workers: int) -> None:
    with _pigeon(tmp_path, workers) as pigeon:
        answers = _all_at_once(pigeon.smtp_port, [PASSWORD] * CONNECTIONS)
        assert answers == [RIGHT] * CONNECTIONS
        assert not [r for r in pigeon.records("Rejection") if r["command"] == "AUTH"]
        assert "AUTH locked out" not in pigeon.stderr()


@WORKERS
def test_wrong_passwords_sent_at_once_from_one_address_get_no_more_checks_than_the_limit(
    tmp_path: Path, workers: int
) -> None:
    with _pigeon(tmp_path, workers) as pigeon:
        answers = _all_at_once(pigeon.smtp_port, [f"guess-{i}" for i in range(CONNECTIONS)])
        assert answers.count(WRONG) == 10, answers
        assert answers.count(LOCKED_OUT) == CONNECTIONS - 10, answers
        assert pigeon.stderr().count(f"AUTH locked out for client {CLIENT}") == 1
