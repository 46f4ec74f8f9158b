"""An IPv6 address with a port is written "[::1]:2525" wherever Pigeon shows one, as the
configuration writes it: "::1:2525" could be the address ::1:2525 on no port at all."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.support.ports import free_port
from tests.support.process import PigeonProcess, to_toml


def test_the_listening_lines_write_an_ipv6_address_in_brackets(tmp_path: Path) -> None:
    # Found from outside: "smtp listening on ::1:44125", while errors of the same run wrote
    # "[::1]:44127".
    v6 = free_port()
    pigeon = PigeonProcess(tmp_path / "node")
    pigeon.config["smtp"]["listen"].append(f"[::1]:{v6}")
    pigeon.config_path.write_text(to_toml(pigeon.config))
    with pigeon:
        said = pigeon.stderr()
    assert f"smtp listening on [::1]:{v6}" in said, said
    assert f"smtp listening on 127.0.0.1:{pigeon.smtp_port}" in said, said


def _received_line(port: int, helo: str) -> bytes:
    """The first line of the Received field of a message sent over IPv6 to [::1]:`port`,
    from a client that named itself `helo`."""
    with socket.create_connection(("::1", port), timeout=10) as raw, raw.makefile("rwb") as stream:

        def say(line: str) -> bytes:
            stream.write(line.encode() + b"\r\n")
            stream.flush()
            reply = stream.readline()
            while reply[3:4] == b"-":
                reply = stream.readline()
            return reply

        assert stream.readline().startswith(b"220")
        for command in (f"EHLO {helo}", "MAIL FROM:<a@example.org>", "RCPT TO:<b@example.net>", "DATA"):
            assert say(command)[:1] in (b"2", b"3"), command
        reply = say("Subject: v6\r\n\r\nhi\r\n.")
        assert reply.startswith(b"250"), reply
        return reply.split(b"queued as ", 1)[1].split()[0]


def test_the_received_field_names_an_ipv6_client_with_the_ipv6_tag(tmp_path: Path) -> None:
    # Found from outside: "Received: from client.test ([::1])" and "from [::1] (helo=a;b)":
    # an IPv6 address literal is "[IPv6:::1]" (RFC 5321 4.1.3), else it reads as no address.
    v6 = free_port()
    pigeon = PigeonProcess(tmp_path / "node")
    pigeon.config["smtp"]["listen"].append(f"[::1]:{v6}")
    pigeon.config_path.write_text(to_toml(pigeon.config))
    with pigeon:
        ids = {helo: _received_line(v6, helo).decode() for helo in ("client.test", "a;b")}
        bodies = {m["id"]: m["data"] for m in pigeon.spool_messages()}
    first = {helo: bodies[spool_id].split(b"\r\n", 1)[0] for helo, spool_id in ids.items()}
    assert first == {
        "client.test": b"Received: from client.test ([IPv6:::1])",
        "a;b": b"Received: from [IPv6:::1] (helo=a;b)",
    }
