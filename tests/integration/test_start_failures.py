"""A node that cannot start says why and exits: 2 for what the configuration names, 1 for
the rest; a worker that fails says why through its supervisor, not only "worker exited"."""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path

from pigeon.listener.tls import ensure_self_signed
from tests.support.process import PigeonProcess


def test_a_key_that_is_not_the_certificates_stops_the_start_with_exit_2(tmp_path: Path) -> None:
    certificate, _ = ensure_self_signed(tmp_path / "one", "mx.pigeon.test")
    _, other_key = ensure_self_signed(tmp_path / "two", "mx.pigeon.test")
    smtp = {"tls_certificate": str(certificate), "tls_private_key": str(other_key)}
    pigeon = PigeonProcess(tmp_path / "node", node={"workers": 2}, smtp=smtp)
    pigeon.start(wait=False)
    assert pigeon.wait_exit() == 2
    said = pigeon.stderr()
    assert "pigeon: configuration error: " in said
    assert f"[smtp] tls_private_key: {other_key} is not the key of the certificate in {certificate}" in said
    assert not (pigeon.spool_path / "shard-0").exists()  # nothing started


def test_smtp_users_without_starttls_stop_the_start_with_exit_2_naming_both_settings(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.touch()
    pigeon = PigeonProcess(tmp_path / "node", smtp={"auth_users": str(users), "starttls": False})
    pigeon.start(wait=False)
    assert pigeon.wait_exit() == 2
    assert "[smtp] auth_users: is set but [smtp] starttls = false" in pigeon.stderr()
    assert "set [smtp] allow_plaintext_auth = true" in pigeon.stderr()


def test_two_api_tokens_with_one_secret_stop_the_start_with_exit_2(tmp_path: Path) -> None:
    secret = "s" * 32
    tokens = [{"name": name, "token": secret, "scopes": ["admin"]} for name in ("ops", "deploy")]
    pigeon = PigeonProcess(tmp_path / "node", http={"token": tokens})
    pigeon.start(wait=False)
    assert pigeon.wait_exit() == 2
    said = pigeon.stderr()
    assert "[[http.token]] 'deploy' has the same secret as 'ops'" in said
    assert secret not in said


def test_a_worker_that_cannot_start_is_named_with_its_reason(tmp_path: Path) -> None:
    pigeon = PigeonProcess(tmp_path / "node", node={"workers": 2})
    shard = pigeon.spool_path / "shard-1"
    shard.mkdir(parents=True)
    lock = os.open(shard / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a stray process left holding the shard would
        os.write(lock, f"{os.getpid()}\n".encode())
        pigeon.start(wait=False)
        assert pigeon.wait_exit() == 1
    finally:
        os.close(lock)
    assert (
        f"pigeon: cannot start: worker 1 exited with status 1 during start-up: spool {shard} is in use by "
        f"another Pigeon process (pid {os.getpid()})" in pigeon.stderr()
    )


def test_a_worker_killed_by_a_signal_is_named_with_the_signal_when_it_is_restarted(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", node={"workers": 2}) as pigeon:
        os.kill(pigeon.shard_owner(0), signal.SIGKILL)
        said = pigeon.wait_stderr("restarting in")
        assert "worker 0 was killed by SIGKILL (it said no more: see its messages above); restarting in 1s" in said
