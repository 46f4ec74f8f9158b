"""SIGHUP reloads the TLS certificate, the SMTP users and the routes without dropping a connection
(a session authenticated as a user removed loses its authentication, not its connection)."""

from __future__ import annotations

import signal
import smtplib
import ssl
import time
from pathlib import Path

import pytest

from pigeon.listener.passwords import set_password
from pigeon.listener.tls import ensure_self_signed
from pigeon.tls import server_context
from tests.support.process import PigeonProcess, to_toml
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

MESSAGE = b"From: a@example.org\r\nSubject: reload\r\n\r\nhello\r\n"


def _any_certificate() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _starttls(port: int) -> tuple[smtplib.SMTP, bytes]:
    """A session after STARTTLS, and the certificate the server showed."""
    client = smtplib.SMTP("127.0.0.1", port, timeout=10)
    client.starttls(context=_any_certificate())
    client.ehlo()
    assert isinstance(client.sock, ssl.SSLSocket)
    certificate = client.sock.getpeercert(binary_form=True)
    assert certificate is not None
    return client, certificate


def _hangup(pigeon: PigeonProcess, outcome: str, workers: int = 1) -> None:
    """SIGHUP, then wait until every worker logged `outcome` ("reloaded:" or "reload failed"; the
    supervisor of several says the latter too, and is not counted)."""
    assert pigeon.process is not None
    said = f"pigeon.node.node: {outcome}"
    before = pigeon.stderr().count(said)
    pigeon.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while pigeon.stderr().count(said) < before + workers:
        assert time.monotonic() < deadline, pigeon.stderr()
        time.sleep(0.05)


def _pem_pair(directory: Path) -> tuple[bytes, bytes]:
    certificate, key = ensure_self_signed(directory, "mx.pigeon.test")
    return certificate.read_bytes(), key.read_bytes()


def test_sighup_takes_a_new_certificate_while_an_open_tls_session_goes_on(tmp_path: Path) -> None:
    first, second = _pem_pair(tmp_path / "first"), _pem_pair(tmp_path / "second")
    certificate, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    certificate.write_bytes(first[0])
    key.write_bytes(first[1])
    smtp = {"tls_certificate": str(certificate), "tls_private_key": str(key)}
    with PigeonProcess(tmp_path / "node", node={"workers": 2}, smtp=smtp) as pigeon:
        session, shown = _starttls(pigeon.smtp_port)
        assert shown == ssl.PEM_cert_to_DER_cert(first[0].decode())
        certificate.write_bytes(second[0])
        key.write_bytes(second[1])
        _hangup(pigeon, "reloaded:", workers=2)
        for _ in range(6):  # new connections, whichever worker takes them
            fresh, shown = _starttls(pigeon.smtp_port)
            assert shown == ssl.PEM_cert_to_DER_cert(second[0].decode())
            fresh.quit()
        assert session.sendmail("a@src.test", ["b@dst.test"], MESSAGE) == {}
        session.quit()
        assert len(pigeon.spool_messages()) == 1


def test_a_reload_that_cannot_read_the_certificate_keeps_the_running_one(tmp_path: Path) -> None:
    first = _pem_pair(tmp_path / "first")
    certificate, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    certificate.write_bytes(first[0])
    key.write_bytes(first[1])
    smtp = {"tls_certificate": str(certificate), "tls_private_key": str(key)}
    with PigeonProcess(tmp_path / "node", smtp=smtp) as pigeon:
        certificate.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
        _hangup(pigeon, "reload failed")
        assert "reload failed; the running configuration stays:" in pigeon.stderr()
        session, shown = _starttls(pigeon.smtp_port)
        assert shown == ssl.PEM_cert_to_DER_cert(first[0].decode())
        assert session.sendmail("a@src.test", ["b@dst.test"], MESSAGE) == {}
        session.quit()
        # A config file that no longer parses is refused the same way.
        pigeon.config_path.write_text("[smtp\n")
        _hangup(pigeon, "reload failed")
        assert "not valid TOML" in pigeon.stderr()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_reload_shows_in_healthz_until_a_reload_succeeds(tmp_path: Path, workers: int) -> None:
    # A key rollover that failed must reach an operator's alerts, not only the log.
    with PigeonProcess(tmp_path / "node", node={"workers": workers}) as pigeon:
        status, health = pigeon.http_call("GET", "/healthz")
        assert (status, health["status"], health["config"]) == (200, "ok", {"status": "ok"}), health
        good = pigeon.config_path.read_text()
        pigeon.config_path.write_text("[smtp\n")
        _hangup(pigeon, "reload failed", workers)
        status, health = pigeon.http_call("GET", "/healthz")
        assert (status, health["status"], health["config"]["status"]) == (200, "degraded", "degraded"), health
        assert "the last reload failed" in health["config"]["error"] and "not valid TOML" in health["config"]["error"]
        if workers > 1:
            assert all(worker["config"]["status"] == "degraded" for worker in health["workers"]), health
        # Still serving what it ran before; a reload that succeeds clears it.
        pigeon.config_path.write_text(good)
        _hangup(pigeon, "reloaded:", workers)
        status, health = pigeon.http_call("GET", "/healthz")
        assert (status, health["status"], health["config"]) == (200, "ok", {"status": "ok"}), health


def test_a_reload_whose_file_does_not_load_is_an_error_in_the_supervisor_s_log_saying_why_first(
    tmp_path: Path,
) -> None:
    # As each worker says it: an operator (or an alert on ERROR) reads the supervisor's line too.
    with PigeonProcess(tmp_path / "node", node={"workers": 2}) as pigeon:
        pigeon.config_path.write_text("[smtp\n")
        _hangup(pigeon, "reload failed", workers=2)
        said = [line for line in pigeon.stderr().splitlines() if "pigeon.node.supervisor: reload" in line]
        failed = [line for line in said if "not valid TOML" in line]
        assert len(failed) == 1, said
        assert " main ERROR pigeon.node.supervisor: reload failed; the running configuration stays: " in failed[0]
        why, side_note = failed[0].index("not valid TOML"), failed[0].index("a worker started again")
        assert why < side_note, failed[0]


def test_sighup_takes_new_smtp_users_and_a_removed_user_s_open_session_loses_its_auth(tmp_path: Path) -> None:
    users = tmp_path / "users"
    set_password(users, "alice", "alice-secret")
    # Loopback is not a relay network here: sending needs AUTH.
    smtp = {"auth_users": str(users), "relay_networks": ["192.0.2.0/24"], "allow_plaintext_auth": True}
    with PigeonProcess(tmp_path / "node", smtp=smtp) as pigeon:
        alice = smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10)
        alice.login("alice", "alice-secret")
        users.write_text("")
        set_password(users, "bob", "bob-secret")
        _hangup(pigeon, "reloaded:")
        assert ", 1 SMTP user, " in pigeon.stderr()
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as bob:
            assert bob.login("bob", "bob-secret")[0] == 235
        with (
            smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client,
            pytest.raises(smtplib.SMTPAuthenticationError) as refused,
        ):
            client.login("alice", "alice-secret")
        assert refused.value.smtp_code == 535
        # The session she opened before is no longer authenticated either (see
        # test_reload_withdraws_open_sessions_authorization.py).
        with pytest.raises(smtplib.SMTPSenderRefused) as revoked:
            alice.sendmail("alice@src.test", ["b@dst.test"], MESSAGE)
        assert revoked.value.smtp_code == 421  # and the connection closed: she connects again


def test_sighup_takes_new_routes_and_names_the_changes_that_need_a_restart(tmp_path: Path) -> None:
    with ScriptedSink() as before, ScriptedSink() as after:
        pigeon = PigeonProcess(tmp_path / "node", **delivery_config(before.endpoint))
        with pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                client.sendmail("a@src.test", ["ok@dst.test"], MESSAGE)
                assert len(before.wait_for(1)) == 1
                pigeon.config["route"][0]["next_hop"] = after.endpoint
                pigeon.config["smtp"]["max_message_size"] = "1MiB"
                pigeon.config_path.write_text(to_toml(pigeon.config))
                _hangup(pigeon, "reloaded:")
                client.sendmail("a@src.test", ["ok@dst.test"], MESSAGE)  # the same session goes on
            assert len(after.wait_for(1)) == 1
            assert len(before.received) == 1
        assert "reload: [smtp] max_message_size changed; it takes effect at the next restart" in pigeon.stderr()
        assert pigeon.stderr().count("takes effect at the next restart") == 1  # the route was taken
        assert "reloaded: TLS on, no SMTP users, 1 route, 0 DKIM signers" in pigeon.stderr()


def test_sighup_takes_new_reaction_rules(tmp_path: Path) -> None:
    with ScriptedSink() as sink:
        sink.rcpt_reply = lambda address: "421 4.7.0 rate limited" if address.startswith("first") else None
        rule = {"id": "sink-rated", "match": r"^421 4\.7\.0 .*slow down", "action": "suspend", "duration": "1m"}
        config = delivery_config(sink.endpoint, default_reactions=False)
        with PigeonProcess(tmp_path / "node", log={"level": "info"}, reaction=[rule], **config) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                client.sendmail("a@src.test", ["first-1@dst.test"], MESSAGE)
            pigeon.wait_records("TransientFailure")
            assert pigeon.records("ShapingEffect") == []  # the rule does not match this reply
            pigeon.config["reaction"][0]["match"] = r"^421 4\.7\.0 .*rate limited"
            pigeon.config_path.write_text(to_toml(pigeon.config))
            _hangup(pigeon, "reloaded:")
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                client.sendmail("a@src.test", ["first-2@dst.test"], MESSAGE)
            [effect] = pigeon.wait_records("ShapingEffect")
        assert (effect["rule"], effect["action"], effect["event"]) == ("sink-rated", "suspend", "created")
        assert "0 DKIM signers (keys read again), 0 [[shaping]] blocks, 1 reaction rule" in pigeon.stderr()
        assert "takes effect at the next restart" not in pigeon.stderr()


def test_sighup_takes_new_shaping_limits_for_mail_already_waiting(tmp_path: Path) -> None:
    with ScriptedSink() as sink:
        with PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint, max_message_rate="1/s")) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                for n in range(8):
                    client.sendmail("a@src.test", [f"ok{n}@dst.test"], MESSAGE)
            sink.wait_for(2)
            assert len(sink.received) < 6  # one a second
            pigeon.config["delivery"]["max_message_rate"] = "100/s"
            pigeon.config_path.write_text(to_toml(pigeon.config))
            _hangup(pigeon, "reloaded:")
            started = time.monotonic()
            sink.wait_for(8)
            took = time.monotonic() - started
        assert took < 3, took  # at the old rate, the 6 or so left would take 5 s or more
        assert "reloaded: TLS on, no SMTP users, 1 route, 0 DKIM signers (keys read again), 0 [[shaping]] blocks" in (
            pigeon.stderr()
        )
        assert "takes effect at the next restart" not in pigeon.stderr()


def _tls_sink(directory: Path) -> ScriptedSink:
    certificate, key = ensure_self_signed(directory, "127.0.0.1")
    return ScriptedSink(tls=server_context(certificate, key))


def _require_tls(pigeon: PigeonProcess) -> None:
    pigeon.config["route"][0]["tls"] = "required"
    pigeon.config_path.write_text(to_toml(pigeon.config))
    _hangup(pigeon, "reloaded:")


def test_a_reload_that_requires_tls_applies_to_mail_already_waiting_in_a_plaintext_queue(tmp_path: Path) -> None:
    """The tester's steps: the site suspended, 3 messages queued under `tls = "disabled"`, the
    route changed to `tls = "required"`, SIGHUP, resumed: all 3 go over STARTTLS."""
    with (
        _tls_sink(tmp_path / "sink") as sink,
        PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon,
    ):
        site = sink.endpoint
        status, answer = pigeon.http_call("POST", "/api/v1/admin/suspend", {"site": site}, token=pigeon.local_token)
        assert status == 200, answer
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
            for n in range(3):
                client.sendmail("s@src.test", [f"user{n}@d15.test"], MESSAGE)

        def ready() -> dict[str, int]:
            status, queues = pigeon.http_call("GET", "/api/v1/queues", token=pigeon.local_token)
            assert status == 200, queues
            return {row["path"]: row["queued"] for row in queues["ready"] if row["queued"]}

        wait_until(lambda: ready() == {f"default->{site} (tls disabled)": 3})
        _require_tls(pigeon)
        assert "reload: 3 waiting messages routed again by the new [[route]]s" in pigeon.stderr()
        wait_until(lambda: ready() == {f"default->{site} (tls required)": 3})
        status, answer = pigeon.http_call(
            "DELETE", f"/api/v1/admin/suspend/{answer['rule']['id']}", None, pigeon.local_token
        )
        assert status == 200, answer
        received = sink.wait_for(3)
        deliveries = pigeon.wait_records("Delivery", 3)
        assert sink.after(0.5) == received  # each once
    assert sorted(r.recipients[0] for r in received) == ["user0@d15.test", "user1@d15.test", "user2@d15.test"]
    assert [r.tls for r in received] == [True, True, True]  # none in plaintext
    assert {d["recipient"] for d in deliveries} == {"user0@d15.test", "user1@d15.test", "user2@d15.test"}


def test_a_reload_that_requires_tls_stops_mail_a_plaintext_connection_took_and_had_not_sent(tmp_path: Path) -> None:
    """At 1 message a second, the open plaintext connection holds the next message while it
    waits for its rate slot: after the reload that message goes over TLS too. Only what was
    on the wire when the reload came may still end in plaintext."""
    config = delivery_config("", max_message_rate="1/s")
    with _tls_sink(tmp_path / "sink") as sink:
        config["route"][0]["next_hop"] = sink.endpoint
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                for n in range(6):
                    client.sendmail("s@src.test", [f"user{n}@d15.test"], MESSAGE)
            sink.wait_for(2)
            _require_tls(pigeon)
            plaintext_by_then = len(sink.received)
            received = sink.wait_for(6, timeout=30)
            pigeon.wait_records("Delivery", 6)
            assert sink.after(0.5) == received  # each once
    assert len({r.recipients[0] for r in received}) == 6
    plaintext = [r for r in received if not r.tls]
    assert len(plaintext) <= plaintext_by_then + 1, [(r.recipients, r.tls) for r in received]
    assert all(r.tls for r in received[len(plaintext) :])


OLD_TOKEN, NEW_TOKEN = "old-admin-token-0123456789", "new-admin-token-0123456789"


@pytest.mark.parametrize("workers", [1, 2])
def test_sighup_takes_new_api_tokens_and_relay_networks_at_once(tmp_path: Path, workers: int) -> None:
    """Found from outside: revoking a leaked API token, or taking a network out of
    `relay_networks` (an open relay found), waited for a restart. (With two workers the
    supervisor answers the API: its tokens are taken too.)"""
    tokens = [{"name": "ops", "token": OLD_TOKEN, "scopes": ["read"]}]
    pigeon = PigeonProcess(tmp_path / "node", node={"workers": workers}, http={"token": tokens})
    with pigeon:
        assert pigeon.http_call("GET", "/api/v1/queues", token=OLD_TOKEN)[0] == 200
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
            assert client.sendmail("a@src.test", ["b@dst.test"], MESSAGE) == {}  # loopback relays
        pigeon.config["http"]["token"] = [{"name": "ops2", "token": NEW_TOKEN, "scopes": ["read"]}]
        pigeon.config["smtp"]["relay_networks"] = ["192.0.2.0/24"]
        pigeon.config_path.write_text(to_toml(pigeon.config))
        _hangup(pigeon, "reloaded:", workers)
        assert pigeon.http_call("GET", "/api/v1/queues", token=OLD_TOKEN)[0] == 401
        assert pigeon.http_call("GET", "/api/v1/queues", token=NEW_TOKEN)[0] == 200
        assert pigeon.http_call("GET", "/api/v1/queues", token=pigeon.local_token)[0] == 200  # the CLI's, kept
        for _ in range(4):  # new connections, whichever worker takes each
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                client.ehlo("client.test")
                client.mail("a@src.test")
                code, text = client.rcpt("b@dst.test")
                assert (code, b"relay" in text.lower()) == (550, True), (code, text)
    assert "takes effect at the next restart" not in pigeon.stderr()


def test_sighup_takes_a_users_file_a_running_node_had_none_of_as_the_quick_start_does(tmp_path: Path) -> None:
    """The README's Quick start adds `auth_users` and `relay_networks` to the file of a node that
    runs without them and reloads it (a second start would fail on the node lock): AUTH is
    offered from then on, and loopback no longer relays without it."""
    with PigeonProcess(tmp_path / "node") as pigeon:
        client, _ = _starttls(pigeon.smtp_port)
        with client:
            assert not client.has_extn("auth")
        set_password(tmp_path / "node" / "users", "alice", "alice-secret")
        pigeon.config["smtp"].update(auth_users="users", relay_networks=["192.0.2.0/24"])
        pigeon.config_path.write_text(to_toml(pigeon.config))
        _hangup(pigeon, "reloaded:")
        assert ", 1 SMTP user, " in pigeon.stderr()
        client, _ = _starttls(pigeon.smtp_port)
        with client:
            assert client.has_extn("auth")
            assert client.login("alice", "alice-secret")[0] == 235
            assert client.sendmail("alice@src.test", ["b@dst.test"], MESSAGE) == {}
        with (
            smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as anonymous,
            pytest.raises(smtplib.SMTPRecipientsRefused) as refused,
        ):
            anonymous.sendmail("a@src.test", ["b@dst.test"], MESSAGE)
        assert refused.value.recipients["b@dst.test"][0] == 550
