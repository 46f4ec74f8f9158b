"""A connection turned away at the greeting is told `421` without an enhanced code (RFC 2034 3:
the greeting never carries one), and its `Rejection` record and the README say just that; a
connection closed later in its session (evicted to make room) is told `421 4.7.0`, as logged."""

from __future__ import annotations

import re
import socket
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp

README = Path(__file__).resolve().parents[2] / "README.md"
CLIENT = "127.0.0.7"  # outside relay_networks below


def _greeting(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(CLIENT, 0)) as sock:
        return sock.makefile("rb").readline().rstrip(b"\r\n")


def _readme_row(key: str) -> str:
    (row,) = [line for line in README.read_text().splitlines() if line.startswith(f"| `{key}` |")]
    return row


def test_one_connection_too_many_from_a_client_is_greeted_with_421_and_logged_as_sent(tmp_path: Path) -> None:
    # Found from outside: the wire said "421 <host> too many connections ...", while the record
    # said "enhanced": "4.7.0" and the README "421 4.7.0 ...".
    smtp = {"relay_networks": ["192.0.2.0/24"], "max_connections_per_client": 1}
    with PigeonProcess(tmp_path / "node", smtp=smtp) as pigeon:
        with socket.create_connection(("127.0.0.1", pigeon.smtp_port), timeout=10, source_address=(CLIENT, 0)) as first:
            assert first.makefile("rb").readline().startswith(b"220 ")
            refused = _greeting(pigeon.smtp_port)
        (rejection,) = pigeon.wait_records("Rejection")

    assert refused == b"421 mx.pigeon.test too many connections from your address, try again later"
    assert rejection["command"] == "CONNECT"
    assert rejection["response"] == {"code": 421, "text": refused.decode().removeprefix("421 ")}
    row = _readme_row("[smtp] max_connections_per_client")
    assert "`421 ... too many connections from your address, try again later`" in row, row
    assert "4.7.0" not in row, row


def test_a_newcomer_with_no_idle_connection_to_replace_is_greeted_with_421_and_logged_as_sent(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp={"max_connections": 2}) as pigeon:
        busy, other = RawSmtp(pigeon.smtp_port), RawSmtp(pigeon.smtp_port)
        for client in (busy, other):  # in a transaction: neither may be closed to make room
            client.expect(220)
            client.expect(250, "EHLO client.test")
            client.expect(250, "MAIL FROM:<a@example.org>")
        with socket.create_connection(("127.0.0.1", pigeon.smtp_port), timeout=10) as newcomer:
            refused = newcomer.makefile("rb").readline().rstrip(b"\r\n")
        (rejection,) = pigeon.wait_records("Rejection")
        busy.close()
        other.close()

    assert refused == b"421 mx.pigeon.test too many connections, try again later"
    assert rejection["command"] == "CONNECT" and "enhanced" not in rejection["response"], rejection
    assert re.search(
        r"the newcomer's greeting is `421 \.\.\. too many connections, try again later`",
        _readme_row("[smtp] max_connections"),
    )


def test_an_idle_connection_evicted_for_a_newcomer_is_told_421_4_7_0_as_logged(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp={"max_connections": 2}) as pigeon:
        busy, idle = RawSmtp(pigeon.smtp_port), RawSmtp(pigeon.smtp_port)
        busy.expect(220)
        busy.expect(250, "EHLO client.test")
        busy.expect(250, "MAIL FROM:<a@example.org>")  # in a transaction: not to be evicted
        idle.expect(220)
        idle.expect(250, "EHLO client.test")
        with RawSmtp(pigeon.smtp_port) as newcomer:
            newcomer.expect(220)
            code, text = idle.reply()
        (rejection,) = pigeon.wait_records("Rejection")
        busy.close()
        idle.close()

    assert code == 421 and text[0].startswith("4.7.0 "), text
    assert rejection["response"]["enhanced"] == "4.7.0"
    assert "4.7.0 " + rejection["response"]["text"] == text[0]
