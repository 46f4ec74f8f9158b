"""Past `max_connections`, a connection stalled in the TLS handshake after STARTTLS (sending
nothing, or half a ClientHello) makes room for a newcomer, as one idle between transactions
does: it owes its part of the handshake as an idle one owes its next command, and would
otherwise keep its place until the handshake timeout."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import wait_until

MAX_CONNECTIONS = 20
# A TLS record header and the first octets of a ClientHello that never comes whole.
HALF_A_CLIENT_HELLO = bytes.fromhex("16030102000100") + b"\x01\xfc\x03\x03"


def _closed(client: RawSmtp, within: float) -> bool:
    client.sock.settimeout(within)
    try:
        return client.sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_connections_stalled_in_the_tls_handshake_make_room_for_newcomers(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp={"max_connections": MAX_CONNECTIONS}) as pigeon:
        wait_until(lambda: pigeon.metric("pigeon_smtp_connections") == 0)  # the readiness probe's
        stalled: list[RawSmtp] = []
        newcomers: list[RawSmtp] = []
        try:
            for number in range(MAX_CONNECTIONS):
                client = RawSmtp(pigeon.smtp_port)
                stalled.append(client)
                client.expect(220)
                client.expect(250, "EHLO client.test")
                client.expect(220, "STARTTLS")
                if number % 2:
                    client.send(HALF_A_CLIENT_HELLO)
            time.sleep(0.2)  # (every handshake under way)
            started = time.monotonic()
            for _ in range(3):
                newcomer = RawSmtp(pigeon.smtp_port)
                newcomers.append(newcomer)
                newcomer.expect(220)
            # The three silent longest, one with half a ClientHello, went; long before the
            # handshake timeout (`command_timeout`, 5 min), and the others are still there.
            assert [_closed(client, within=5.0) for client in stalled[:3]] == [True] * 3
            assert time.monotonic() - started < 10
            assert not _closed(stalled[3], within=0.5)
            rejections = pigeon.wait_records("Rejection", 3)
            assert [(r.get("command"), r["response"]["enhanced"]) for r in rejections] == [(None, "4.7.0")] * 3
            assert pigeon.metric("pigeon_smtp_connections_evicted_total") == 3
            for newcomer in newcomers:
                newcomer.expect(250, "EHLO newcomer.test")
        finally:
            for client in stalled + newcomers:
                client.close()
        # Nothing of them is left counted: the slots are free again.
        wait_until(lambda: pigeon.metric("pigeon_smtp_connections") == 0)
        with socket.create_connection(("127.0.0.1", pigeon.smtp_port), timeout=5) as last:
            assert last.recv(3) == b"220"
