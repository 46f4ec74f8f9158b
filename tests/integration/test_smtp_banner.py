"""`[smtp] banner`: the greeting's text after the hostname, as Postfix's smtpd_banner (which
some set to leave out the software's name). The hostname stays first (RFC 5321 4.3.1).

Found from outside, migrating from Postfix: the banner was always `220 <hostname> ESMTP Pigeon`."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

from tests.support.process import PigeonProcess, to_toml


def banner_of(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.settimeout(10)
        line = b""
        while not line.endswith(b"\r\n"):
            chunk = connection.recv(512)
            if not chunk:
                break
            line += chunk
        connection.sendall(b"QUIT\r\n")
    return line


def test_the_banner_is_the_hostname_then_the_configured_text(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp={"banner": "ESMTP ready"}) as pigeon:
        assert banner_of(pigeon.smtp_port) == b"220 mx.pigeon.test ESMTP ready\r\n"
        # Not reloaded, as [smtp] hostname is not: a SIGHUP says so, and the banner stays.
        pigeon.config["smtp"]["banner"] = "ESMTP elsewhere"
        pigeon.config_path.write_text(to_toml(pigeon.config))
        assert pigeon.process is not None
        pigeon.process.send_signal(signal.SIGHUP)
        pigeon.wait_stderr("reload: [smtp] banner changed; it takes effect at the next restart")
        assert banner_of(pigeon.smtp_port) == b"220 mx.pigeon.test ESMTP ready\r\n"


def test_an_empty_banner_greets_with_the_hostname_alone(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp={"banner": ""}) as pigeon:
        assert banner_of(pigeon.smtp_port) == b"220 mx.pigeon.test\r\n"


def test_the_default_banner_is_esmtp_pigeon(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node") as pigeon:
        assert banner_of(pigeon.smtp_port) == b"220 mx.pigeon.test ESMTP Pigeon\r\n"
