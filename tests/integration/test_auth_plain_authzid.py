"""AUTH PLAIN's authorization identity (RFC 4616 2): Pigeon has no proxy authorization, so an
authzid other than the user authenticating is refused with 535 5.7.8, whatever the password,
and logged as any other failed AUTH."""

from __future__ import annotations

import base64
from pathlib import Path

from pigeon.listener.passwords import set_password
from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp

AUTH_FAILED = "5.7.8 Authentication credentials invalid"


def _plain(authzid: str, user: str, password: str) -> str:
    return "AUTH PLAIN " + base64.b64encode(f"{authzid}\0{user}\0{password}".encode()).decode()


def test_auth_plain_acting_as_another_user_is_refused_and_logged(tmp_path: Path) -> None:
    users = tmp_path / "users"
    set_password(users, "alice", "wonderland")
    set_password(users, "bob", "builder")
    smtp = {"auth_users": str(users), "allow_plaintext_auth": True}
    with PigeonProcess(tmp_path / "node", smtp=smtp) as pigeon, RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.expect(250, "EHLO client.test")
        assert client.command(_plain("", "alice", "wrong")) == (535, [AUTH_FAILED])
        assert client.command(_plain("bob", "alice", "wonderland")) == (535, [AUTH_FAILED])
        wrong_password, other_identity = pigeon.wait_records("Rejection", 2)
        for rejection in (wrong_password, other_identity):
            assert (rejection["command"], rejection["response"]["code"]) == ("AUTH", 535)
            assert rejection["response"]["enhanced"] == "5.7.8"
            assert rejection.get("auth_user") is None
        # Not authenticated (a second AUTH would get 503), and the same identity twice is fine.
        assert client.command(_plain("alice", "alice", "wonderland"))[0] == 235
