"""The peer servers of tests/support/services.py are the real thing: what later tests rely on
(Redis losing its data on a restart but keeping its port, Dovecot's IDLE, MOVE and TLS, a
PostgreSQL reachable by its DSN) is shown here, so a failure there is not blamed on Pigeon."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from tests.support.services import Dovecot, Postgres, RedisServer
from tests.support.tools import require


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_redis_restart_keeps_the_port_and_loses_the_data(redis_server: RedisServer) -> None:
    port = redis_server.port
    assert redis_server.url == f"redis://127.0.0.1:{port}/0"
    with redis_server.client() as client:
        client.set("key", "before")
        assert client.get("key") == b"before"

        redis_server.restart()
        assert redis_server.port == port
        assert client.get("key") is None  # the same client reconnects to an empty Redis
        client.set("key", "again")

        redis_server.kill()
        assert _refused(port)
        redis_server.start()
        assert client.get("key") is None
        assert client.info("server")["tcp_port"] == port


class RawImap:
    """Just enough of an IMAP client to wait in IDLE, which imaplib does not do."""

    def __init__(self, dovecot: Dovecot, user: str) -> None:
        self.sock = socket.create_connection((dovecot.host, dovecot.port), timeout=5)
        self.lines = self.sock.makefile("rb")
        assert self.lines.readline().startswith(b"* OK")
        self.command(f"LOGIN {user} {dovecot.users[user]}")

    def command(self, command: str, tag: str = "t") -> list[bytes]:
        """Send a command; the untagged lines before its tagged OK."""
        self.sock.sendall(f"{tag} {command}\r\n".encode())
        lines = []
        while not (line := self.lines.readline()).startswith(f"{tag} ".encode()):
            lines.append(line)
        assert line.startswith(f"{tag} OK".encode()), line
        return lines

    def idle(self) -> None:
        self.sock.sendall(b"i IDLE\r\n")
        assert self.lines.readline().startswith(b"+ ")

    def readline(self, timeout: float) -> bytes:
        self.sock.settimeout(timeout)
        return self.lines.readline()

    def close(self) -> None:
        self.lines.close()
        self.sock.close()


def test_dovecot_idle_hears_of_an_append_move_and_uid_expunge_work(dovecot: Dovecot) -> None:
    uids = dovecot.append("app", [b"Subject: one\r\n\r\n1\r\n", b"Subject: two\r\n\r\n2\r\n"])
    assert uids == [1, 2]
    assert dovecot.unseen("app") == [1, 2]

    watcher = RawImap(dovecot, "app")
    try:
        assert b"* 2 EXISTS\r\n" in watcher.command("SELECT INBOX")
        watcher.idle()
        appended = time.monotonic()
        dovecot.append("app", [b"Subject: three\r\n\r\n3\r\n"])
        assert watcher.readline(timeout=2) == b"* 3 EXISTS\r\n"
        assert time.monotonic() - appended < 1.0
    finally:
        watcher.close()

    dovecot.create_folder("app", "Archive")
    assert set(dovecot.folders("app")) == {"INBOX", "Archive"}
    client = dovecot.connect("app")
    try:
        capabilities = client.capability()[1][0].split()
        assert {b"IDLE", b"MOVE", b"UIDPLUS"} <= set(capabilities)
        client.select("INBOX")
        assert client.uid("MOVE", "1", "Archive")[0] == "OK"
        client.uid("STORE", "2", "+FLAGS", "(\\Deleted \\Seen)")
        assert client.uid("EXPUNGE", "2")[0] == "OK"
    finally:
        client.logout()
    assert dovecot.uids("app") == [3]
    assert dovecot.count("app", "Archive") == 1
    assert dovecot.message("app", dovecot.uids("app", folder="Archive")[0], "Archive").startswith(b"Subject: one")
    assert dovecot.flags("app", 3) == set()


def test_dovecot_takes_2000_appends_quickly_and_verifiable_tls(dovecot: Dovecot) -> None:
    started = time.monotonic()
    uids = dovecot.append("app", (b"Subject: %d\r\n\r\nbody\r\n" % n for n in range(2000)))
    # What keeps it quick (3 s on an idle 2-core machine, 16 s on a loaded one) is one login
    # for them all: a login each would take four times as long. The bound only catches a
    # helper too slow for the stress tests' timeouts.
    assert time.monotonic() - started < 60
    assert dovecot.info_log_path.read_text().count("Login: user=<app>") == 1
    assert uids == list(range(1, 2001))
    assert dovecot.count("app") == 2000

    client = dovecot.connect("app", tls=True)  # IMAPS, certificate checked for 127.0.0.1
    client.logout()
    with (
        socket.create_connection((dovecot.host, dovecot.imaps_port), timeout=5) as raw,
        dovecot.ssl_context().wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        assert tls.recv(100).startswith(b"* OK")


def test_dovecot_starttls_kill_and_start_again(dovecot: Dovecot) -> None:
    import imaplib

    client = imaplib.IMAP4(dovecot.host, dovecot.port, timeout=5)
    client.starttls(dovecot.ssl_context())
    client.login("app", "secret")
    client.logout()
    dovecot.append("app", [b"Subject: kept\r\n\r\nx\r\n"])

    dovecot.kill()
    assert _refused(dovecot.port)
    assert _refused(dovecot.imaps_port)
    dovecot.start()
    assert dovecot.count("app") == 1


def test_dovecot_config_draws_no_warnings(dovecot: Dovecot) -> None:
    result = subprocess.run(
        [require("doveconf"), "-n", "-c", str(dovecot.config_path)], capture_output=True, text=True, check=True
    )
    assert result.stderr == ""


def test_postgres_answers_on_its_dsn_and_survives_a_kill(postgres: Postgres) -> None:
    postgres.execute("CREATE TABLE note (id int PRIMARY KEY, body text); INSERT INTO note VALUES (1, 'a,\"b\"\nc')")
    postgres.execute("INSERT INTO note VALUES (2, NULL)")
    assert postgres.query("SELECT id, body FROM note ORDER BY id") == [("1", 'a,"b"\nc'), ("2", None)]
    assert postgres.query("SHOW data_directory") == [(str(postgres.data_dir),)]

    psql = [require("psql"), "-X", "-At", postgres.dsn, "-c", "SELECT current_user, inet_server_port()"]
    assert subprocess.run(psql, capture_output=True, text=True, check=True).stdout == f"postgres|{postgres.port}\n"

    postgres.kill()
    assert _refused(postgres.port)
    postgres.start()
    assert postgres.query("SELECT count(*) FROM note") == [("2",)]
    with pytest.raises(RuntimeError, match="does not exist"):
        postgres.query("SELECT * FROM missing")
