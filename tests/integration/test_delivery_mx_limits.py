"""How much one attempt spends on a site's MX hosts (`[delivery] mx_address_limit`,
`mx_session_limit`, as Postfix's smtp_mx_address_limit and smtp_mx_session_limit): at most
5 addresses tried, each once however many hosts name it, hosts past the limit not looked
up, and a temporary failure that names what was tried. Real sockets on loopback, a DNS
server of the test's own."""

from __future__ import annotations

import asyncio
import smtplib
import socket
import threading
from collections import Counter
from pathlib import Path

import pytest

from pigeon.delivery.mx import Resolver
from pigeon.delivery.routes import Destination, Hop, TlsPolicy
from pigeon.delivery.session import ClientConnection, ClientOptions, ConnectFailed
from tests.support.dns import DnsServer, Zone
from tests.support.process import PigeonProcess, free_port
from tests.support.sinks import ScriptedSink, wait_until

OPTIONS = ClientOptions(helo_name="client.test", connect_timeout=2.0, reply_timeout=2.0)


class Hosts:
    """SMTP-ish servers on 127.0.0.x, one port: each counts the connections it took."""

    def __init__(self) -> None:
        self.port = free_port()
        self.accepted: Counter[str] = Counter()
        self._servers: list[asyncio.Server] = []

    async def serve(self, address: str, script: str) -> None:
        """`script`: "hangup" (closes at once, no greeting), "greet" (220, then 250 to EHLO),
        "refuse" (220, then 550 to EHLO and HELO), "busy" (a 421 banner)."""

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.accepted[address] += 1
            try:
                if script == "busy":
                    writer.write(b"421 4.3.2 busy\r\n")
                elif script != "hangup":
                    writer.write(b"220 mx ESMTP\r\n")
                    while line := await reader.readline():
                        if line.upper().startswith(b"QUIT"):
                            writer.write(b"221 bye\r\n")
                            break
                        writer.write(b"250 mx\r\n" if script == "greet" else b"550 5.7.1 no\r\n")
                        await writer.drain()
                await writer.drain()
            finally:
                writer.close()

        self._servers.append(await asyncio.start_server(handle, address, self.port))

    def close(self) -> None:
        for server in self._servers:
            server.close()


def _destination(hosts: Hosts, names: list[str]) -> Destination:
    hops = tuple(Hop(n, hosts.port, 10 * i) for i, n in enumerate(names))  # (in preference order)
    return Destination(",".join(sorted(set(names))), hops, TlsPolicy.DISABLED, False)


def _resolver(dns: DnsServer) -> Resolver:
    return Resolver([(dns.address, dns.port)], timeout=1.0)


async def test_eight_dead_hosts_cost_five_connections_and_a_temporary_failure_naming_them() -> None:
    hosts = Hosts()
    zone = Zone({f"mx{n}.test": [("A", f"127.0.0.{20 + n}")] for n in range(9)})
    names = [f"mx{n}.test" for n in range(9)]  # the 9th would take mail: past the limit
    with DnsServer(zone) as dns:
        for n in range(8):
            await hosts.serve(f"127.0.0.{20 + n}", "hangup")
        await hosts.serve("127.0.0.28", "greet")
        try:
            resolver = _resolver(dns)
            for attempt in (1, 2):
                with pytest.raises(ConnectFailed) as raised:
                    await ClientConnection.open(_destination(hosts, names), resolver, OPTIONS)
                failure = raised.value
                # Each attempt starts again from the most preferred host.
                assert hosts.accepted == Counter({f"127.0.0.{20 + n}": attempt for n in range(5)})
            assert failure.reply.code == 451 and (failure.reply.enhanced or "").startswith("4.4.")
            text = failure.reply.text
            assert "mx_address_limit 5" in text, text
            assert all(f"mx{n}.test [127.0.0.{20 + n}]:{hosts.port}" in text for n in range(5)), text
            assert "mx5.test" not in text
            # Hosts past the limit are not even looked up.
            assert {name for name, _ in dns.zone.queries} == {f"mx{n}.test" for n in range(5)}
        finally:
            hosts.close()


async def test_an_address_three_hosts_name_is_connected_to_once() -> None:
    hosts = Hosts()
    zone = Zone({**{f"mx{n}.test": [("A", "127.0.0.30")] for n in range(3)}, "good.test": [("A", "127.0.0.31")]})
    with DnsServer(zone) as dns:
        await hosts.serve("127.0.0.30", "hangup")
        await hosts.serve("127.0.0.31", "greet")
        try:
            names = ["mx0.test", "mx1.test", "mx2.test", "good.test"]
            connection = await ClientConnection.open(_destination(hosts, names), _resolver(dns), OPTIONS)
            assert connection.address == "127.0.0.31"
            assert hosts.accepted == Counter({"127.0.0.30": 1, "127.0.0.31": 1})
            await connection.quit()
        finally:
            hosts.close()


async def test_hosts_whose_lookup_fails_count_so_later_ones_are_not_looked_up() -> None:
    hosts = Hosts()
    zone = Zone(servfail={f"mx{n}.test" for n in range(8)})
    with DnsServer(zone) as dns:
        try:
            names = [f"mx{n}.test" for n in range(8)]
            with pytest.raises(ConnectFailed) as raised:
                await ClientConnection.open(_destination(hosts, names), _resolver(dns), OPTIONS)
            assert raised.value.reply.code == 451 and "mx4.test (no address)" in raised.value.reply.text
            assert {name for name, _ in dns.zone.queries} == {f"mx{n}.test" for n in range(5)}
        finally:
            hosts.close()


async def test_two_hosts_that_greet_and_will_not_do_end_the_attempt_but_banner_refusals_do_not_count() -> None:
    hosts = Hosts()
    zone = Zone({f"mx{n}.test": [("A", f"127.0.0.{40 + n}")] for n in range(4)})
    with DnsServer(zone) as dns:
        for n, script in enumerate(("refuse", "refuse", "refuse", "greet")):
            await hosts.serve(f"127.0.0.{40 + n}", script)
        await hosts.serve("127.0.0.50", "busy")
        await hosts.serve("127.0.0.51", "busy")
        await hosts.serve("127.0.0.52", "greet")
        try:
            names = [f"mx{n}.test" for n in range(4)]
            with pytest.raises(ConnectFailed) as raised:
                await ClientConnection.open(_destination(hosts, names), _resolver(dns), OPTIONS)
            reply = raised.value.reply
            assert "mx_session_limit 2" in reply.text and reply.code == 451, reply
            assert hosts.accepted == Counter({"127.0.0.40": 1, "127.0.0.41": 1})
            # Turned away at the banner (421): no session, the next host is tried.
            busy = Destination(
                "x", tuple(Hop(f"127.0.0.{n}", hosts.port, n) for n in (50, 51, 52)), TlsPolicy.DISABLED, False
            )
            connection = await ClientConnection.open(busy, _resolver(dns), OPTIONS)
            assert connection.address == "127.0.0.52"
            await connection.quit()
        finally:
            hosts.close()


def _tarpit_free(address: str, port: int, accepted: list[str], stop: threading.Event) -> threading.Thread:
    """A host that takes the connection and hangs up at once (counted)."""
    listener = socket.create_server((address, port))
    listener.settimeout(0.1)

    def run() -> None:
        with listener:
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                accepted.append(address)
                conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_node_tries_five_of_eight_dead_mx_hosts_per_attempt_and_logs_a_temporary_failure(tmp_path: Path) -> None:
    port = free_port()
    zone = Zone(
        {
            "many.test": [("MX", 10 + n, f"mx{n}.many.test") for n in range(9)],
            **{f"mx{n}.many.test": [("A", f"127.0.0.{60 + n}")] for n in range(9)},
        }
    )
    accepted: list[str] = []
    stop = threading.Event()
    threads = [_tarpit_free(f"127.0.0.{60 + n}", port, accepted, stop) for n in range(8)]
    settings = {"enabled": True, "smtp_port": port, "retry_interval": "1h", "dsn": False, "tls": "disabled"}
    try:
        with (
            DnsServer(zone) as dns,
            ScriptedSink(host="127.0.0.68", port=port) as sink,
            PigeonProcess(
                tmp_path / "node", delivery=settings, dns={"nameservers": [dns.endpoint], "timeout": "1s"}
            ) as pigeon,
        ):
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                client.sendmail("a@example.org", ["x@many.test"], b"Subject: many\r\n\r\nhi\r\n")
            (failure,) = wait_until(lambda: pigeon.records("TransientFailure"))
            response = failure["response"]
            assert response["code"] == 451 and response["enhanced"].startswith("4.4."), response
            assert "mx_address_limit 5" in str(response), response
            assert sorted(accepted) == [f"127.0.0.{60 + n}" for n in range(5)]
            assert not sink.received
    finally:
        stop.set()
        for thread in threads:
            thread.join()


async def test_a_hosts_reply_is_what_fails_the_attempt_rather_than_a_later_address_refusing_the_connection() -> None:
    # mx0 answers 421 at its banner, mx1 (where nothing listens) refuses the connection: the
    # 421 says why; "Connection refused" said only that the last address tried was empty.
    hosts = Hosts()
    zone = Zone({"mx0.test": [("A", "127.0.0.40")], "mx1.test": [("A", "127.0.0.41")]})
    with DnsServer(zone) as dns:
        await hosts.serve("127.0.0.40", "busy")
        try:
            with pytest.raises(ConnectFailed) as raised:
                await ClientConnection.open(_destination(hosts, ["mx0.test", "mx1.test"]), _resolver(dns), OPTIONS)
        finally:
            hosts.close()
    failure = raised.value
    assert str(failure.reply).startswith("421 4.3.2 busy"), failure.reply
    assert not failure.site_down and failure.peer == f"mx0.test [127.0.0.40]:{hosts.port}"
