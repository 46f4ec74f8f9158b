"""A reload that removes an SMTP user, or gives it another password, takes the authentication of
its open sessions too: their next MAIL (or RCPT, in a transaction begun before) gets
`421 4.7.0` and the connection closes, to authenticate again on a new one (temporary: a 5xx
would make a client on a cached connection bounce its mail), and a transaction they had open is
refused at DATA or at its end with `451 4.7.0` (the client keeps the message). A user left as
it was goes on, and so does one whose client relays from `relay_networks` anyway. The
same for a client whose network a reload takes out of `relay_networks`: it relays no more on
the connection it opened before. (Found by a tester: a session authenticated as a user removed
went on relaying, up to 10,000 messages of 1,000 recipients each.)"""

from __future__ import annotations

import signal
import smtplib
import ssl
import time
from pathlib import Path
from typing import Any

import pytest

from pigeon.listener.passwords import set_password
from tests.support.process import PigeonProcess, to_toml

MESSAGE = b"From: a@example.org\r\nSubject: reload\r\n\r\nhello\r\n"


def _hangup(pigeon: PigeonProcess) -> None:
    assert pigeon.process is not None
    before = pigeon.stderr().count("reloaded:")
    pigeon.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while pigeon.stderr().count("reloaded:") <= before:
        assert time.monotonic() < deadline, pigeon.stderr()
        time.sleep(0.05)


def _login(port: int, user: str, password: str) -> smtplib.SMTP:
    """A session after STARTTLS and AUTH, as a mail client submits."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    client = smtplib.SMTP("127.0.0.1", port, timeout=10)
    client.starttls(context=context)
    client.login(user, password)
    return client


def _users(tmp_path: Path, *names: str) -> Path:
    """A users file with each of `names`, whose password is `<name>-secret`."""
    users = tmp_path / "users"
    for user in names:
        set_password(users, user, f"{user}-secret")
    return users


def _auth_needed(users: Path) -> dict[str, Any]:
    # Loopback is not a relay network here: sending elsewhere needs AUTH.
    return {"auth_users": str(users), "relay_networks": ["192.0.2.0/24"]}


def test_a_session_of_a_user_removed_or_changed_by_a_reload_must_authenticate_again(tmp_path: Path) -> None:
    users = _users(tmp_path, "alice", "bob", "carol")
    with PigeonProcess(tmp_path / "node", smtp=_auth_needed(users)) as pigeon:
        alice = _login(pigeon.smtp_port, "alice", "alice-secret")
        bob = _login(pigeon.smtp_port, "bob", "bob-secret")
        carol = _login(pigeon.smtp_port, "carol", "carol-secret")
        assert alice.sendmail("alice@src.test", ["x@dst.test"], MESSAGE) == {}
        # alice removed, carol given a new password, bob left as he was.
        kept = [line for line in users.read_text().splitlines() if line.startswith("bob:")]
        users.write_text("\n".join(kept) + "\n")
        set_password(users, "carol", "carol-new-secret")
        _hangup(pigeon)
        assert ", 2 SMTP users, " in pigeon.stderr()

        for client, user in ((alice, "alice"), (carol, "carol")):
            with pytest.raises(smtplib.SMTPSenderRefused) as refused:
                client.sendmail(f"{user}@src.test", ["x@dst.test"], MESSAGE)
            assert refused.value.smtp_code == 421
            assert refused.value.smtp_error.decode() == (
                f"4.7.0 the credentials of {user} were revoked: connect and authenticate again"
            )
            assert client.sock is None  # closed: smtplib, as any client, connects again for the next
        assert bob.sendmail("bob@src.test", ["x@dst.test"], MESSAGE) == {}

        # On a new connection: alice no more, carol with her new password.
        with pytest.raises(smtplib.SMTPAuthenticationError) as refused_auth:
            _login(pigeon.smtp_port, "alice", "alice-secret")
        assert refused_auth.value.smtp_code == 535
        carol = _login(pigeon.smtp_port, "carol", "carol-new-secret")
        assert carol.sendmail("carol@src.test", ["x@dst.test"], MESSAGE) == {}
        for client in (bob, carol):
            client.quit()

        stderr = pigeon.stderr()
        assert "authenticated as 'alice', whose credentials the reload removed: its next MAIL or RCPT" in stderr
        assert "authenticated as 'carol', whose credentials the reload changed" in stderr
        assert "'bob'" not in stderr
        refusals = [r for r in pigeon.wait_records("Rejection", 3) if r["command"] == "MAIL"]
        assert sorted((r["sender"], r["response"]["code"]) for r in refusals) == [
            ("alice@src.test", 421),
            ("carol@src.test", 421),
        ]
        senders = sorted(m["sender"] for m in pigeon.spool_messages())
        assert senders == ["alice@src.test", "bob@src.test", "carol@src.test"]  # alice's from before the reload


def test_a_transaction_open_across_the_reload_is_refused_for_now_and_kept_by_the_client(tmp_path: Path) -> None:
    users = _users(tmp_path, "dave", "erin", "frank")
    with PigeonProcess(tmp_path / "node", smtp=_auth_needed(users)) as pigeon:
        # dave: MAIL and RCPT taken before the reload, DATA after. erin: in the content at the reload.
        dave = _login(pigeon.smtp_port, "dave", "dave-secret")
        assert dave.mail("dave@src.test")[0] == 250
        assert dave.rcpt("one@dst.test")[0] == 250
        erin = _login(pigeon.smtp_port, "erin", "erin-secret")
        assert erin.mail("erin@src.test")[0] == 250
        assert erin.rcpt("one@dst.test")[0] == 250
        erin.putcmd("DATA")
        assert erin.getreply()[0] == 354
        assert erin.sock is not None
        erin.sock.sendall(MESSAGE)
        users.write_text("".join(line + "\n" for line in users.read_text().splitlines() if line.startswith("frank:")))
        _hangup(pigeon)
        assert ", 1 SMTP user, " in pigeon.stderr()

        dave.putcmd("DATA")
        assert dave.getreply() == (
            451,
            b"4.7.0 Message not accepted: the credentials of dave were revoked during this transaction; send it again",
        )
        erin.sock.sendall(b".\r\n")
        assert erin.getreply() == (
            451,
            b"4.7.0 Message not accepted: the credentials of erin were revoked during this transaction; send it again",
        )
        for client in (dave, erin):
            assert client.rset()[0] == 250
            with pytest.raises(smtplib.SMTPSenderRefused) as refused:
                client.sendmail("x@src.test", ["y@dst.test"], MESSAGE)
            assert refused.value.smtp_code == 421
        # One whose transaction goes on with another RCPT: the 421 there, the connection closed.
        frank = _login(pigeon.smtp_port, "frank", "frank-secret")
        assert frank.mail("frank@src.test")[0] == 250
        assert frank.rcpt("one@dst.test")[0] == 250
        users.write_text(users.read_text().replace("frank:", "frank-gone:"))
        _hangup(pigeon)
        assert frank.rcpt("two@dst.test") == (
            421,
            b"4.7.0 the credentials of frank were revoked: connect and authenticate again",
        )
        assert pigeon.spool_messages() == []
        assert "its open transaction is refused at its end (451 4.7.0)" in pigeon.stderr()


def test_a_relay_networks_client_whose_user_a_reload_changed_goes_on_unauthenticated(tmp_path: Path) -> None:
    # Its AUTH was a formality: it may relay from where it is. A 421 would only delay its mail.
    users = tmp_path / "users"
    set_password(users, "app", "app-secret")
    with PigeonProcess(tmp_path / "node", smtp={"auth_users": str(users)}) as pigeon:  # loopback relays
        app = _login(pigeon.smtp_port, "app", "app-secret")
        assert app.mail("app@src.test")[0] == 250
        assert app.rcpt("one@dst.test")[0] == 250
        set_password(users, "app", "app-secret")  # the same password, salted anew: another entry
        _hangup(pigeon)
        assert app.rcpt("two@dst.test")[0] == 250
        assert app.data(MESSAGE)[0] == 250
        assert app.sendmail("app@src.test", ["three@dst.test"], MESSAGE) == {}
        app.quit()
        assert len(pigeon.spool_messages()) == 2
        assert "authenticated as 'app', whose credentials the reload changed: it goes on unauthenticated" in (
            pigeon.stderr()
        )


def test_a_network_a_reload_takes_out_of_relay_networks_relays_no_more_on_open_connections(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node") as pigeon:  # loopback relays, by default
        idle = smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10)
        assert idle.sendmail("a@src.test", ["x@dst.test"], MESSAGE) == {}
        busy = smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10)
        busy.ehlo()
        assert busy.mail("a@src.test")[0] == 250
        assert busy.rcpt("x@dst.test")[0] == 250
        pigeon.config["smtp"]["relay_networks"] = ["192.0.2.0/24"]
        pigeon.config_path.write_text(to_toml(pigeon.config))
        _hangup(pigeon)

        with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
            idle.sendmail("a@src.test", ["y@dst.test"], MESSAGE)
        assert refused.value.recipients["y@dst.test"] == (550, b"5.7.1 Relay access denied")
        assert busy.rcpt("y@dst.test") == (550, b"5.7.1 Relay access denied")
        busy.putcmd("DATA")
        assert busy.getreply() == (
            451,
            b"4.7.0 Message not accepted: this client's permission to relay was withdrawn during this "
            b"transaction; send it again",
        )
        for client in (idle, busy):
            client.quit()
        assert len(pigeon.spool_messages()) == 1  # the one sent before the reload
        assert "client 127.0.0.1 is no longer in [smtp] relay_networks after the reload: it relays no more" in (
            pigeon.stderr()
        )
