"""Which address and port are this node's own listeners (`pigeon.delivery.loops`), and the
connection opener passing such hosts over (`ClientConnection.open`)."""

from __future__ import annotations

import socket

import pytest

from pigeon.delivery.loops import IpAddress, Listeners, parse_address
from pigeon.delivery.mx import DnsFailure, Resolver
from pigeon.delivery.routes import Destination, Hop, TlsPolicy
from pigeon.delivery.session import ClientConnection, ClientOptions, ConnectFailed, LoopsBack
from pigeon.smtp.replies import Reply
from tests.support.ports import free_port


def test_only_the_exact_address_and_port_of_a_listener_is_this_node() -> None:
    own = Listeners([("127.0.0.1", 2525), ("::1", 2525)], is_local=lambda address: pytest.fail("not asked"))
    assert own.is_self("127.0.0.1", 2525)
    assert own.is_self("::1", 2525)
    assert own.is_self("::ffff:127.0.0.1", 2525)  # (IPv4-mapped)
    assert not own.is_self("127.0.0.1", 2526)  # another node on this machine, on another port
    assert not own.is_self("127.0.0.2", 2525)  # ... or at another loopback address
    assert not own.is_self("mx.example.net", 2525)  # (a name is resolved before it is asked of)


def test_a_wildcard_listener_is_every_local_address_of_its_family() -> None:
    local = {parse_address("192.0.2.10")}
    asked: list[IpAddress] = []

    def is_local(address: IpAddress) -> bool:
        asked.append(address)
        return address in local

    own = Listeners([("0.0.0.0", 25)], is_local=is_local)
    assert own.is_self("127.0.0.5", 25)  # loopback, without asking
    assert own.is_self("0.0.0.0", 25)  # (a connection to it goes to loopback)
    assert own.is_self("192.0.2.10", 25)
    assert own.is_self("192.0.2.10", 25)  # (remembered)
    assert not own.is_self("192.0.2.11", 25)
    assert not own.is_self("192.0.2.10", 26)
    assert not own.is_self("::1", 25)  # IPv6 sockets are bound IPv6-only: 0.0.0.0 takes no IPv6
    assert asked == [parse_address("192.0.2.10"), parse_address("192.0.2.11")]
    assert Listeners([("::", 25)], is_local=is_local).is_self("::1", 25)


def test_a_listener_is_what_was_bound_and_port_0_none_until_then() -> None:
    own = Listeners([("127.0.0.1", 0), ("localhost", 2525), ("mx.example", 25)])
    assert not own.is_self("127.0.0.1", 0)
    assert own.is_self("127.0.0.1", 2525) and own.is_self("::1", 2525)  # localhost: loopback
    own.replace([("127.0.0.1", 40001)])
    assert own.is_self("127.0.0.1", 40001)
    assert not own.is_self("127.0.0.1", 2525)


def test_the_kernel_tells_the_machine_s_own_addresses_from_others() -> None:
    # The address this machine would reach the documentation network from (no packet sent).
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))
            mine = probe.getsockname()[0]
    except OSError:
        pytest.skip("no IPv4 route out of this machine")
    own = Listeners([("0.0.0.0", 25)])
    assert own.is_self(mine, 25)
    assert not own.is_self("192.0.2.1", 25)


class _Addresses(Resolver):
    """Hosts' addresses from a table; a host missing from it fails its lookup."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        super().__init__([("127.0.0.1", 9)])
        self._table = table

    async def addresses(self, host: str) -> list[str]:
        if host not in self._table:
            raise DnsFailure(Reply(451, "4.4.3", (f"DNS lookup of A {host} failed: timed out after 5s",)))
        return self._table[host]


def _destination(*hops: Hop) -> Destination:
    return Destination(",".join(h.host for h in hops), hops, TlsPolicy.DISABLED, False)


_OPTIONS = ClientOptions("client.test", connect_timeout=2.0)


async def test_a_destination_whose_every_host_is_this_node_loops_back() -> None:
    port = free_port()
    own = Listeners([("127.0.0.1", port)])
    resolver = _Addresses({"mx1.loop.test": ["127.0.0.1"], "localhost": ["127.0.0.1", "::1"]})
    destination = _destination(Hop("mx1.loop.test", port, 10), Hop("localhost", port, 20), Hop("127.0.0.1", port, 30))
    with pytest.raises(LoopsBack) as caught:
        await ClientConnection.open(destination, resolver, _OPTIONS, own=own)
    assert caught.value.reply.code == 554 and caught.value.reply.enhanced == "5.4.6"
    assert caught.value.reply_for("loop.test").text == (
        f"mail for loop.test loops back to myself (mx1.loop.test [127.0.0.1]:{port} is this node)"
    )


async def test_a_host_that_may_be_another_s_is_no_loop() -> None:
    # A host more preferred than this node cannot be reached or resolved: a transient failure,
    # which may pass.
    port, down = free_port(), free_port()
    own = Listeners([("127.0.0.1", port)])
    resolver = _Addresses({"mx1.loop.test": ["127.0.0.1"], "mx2.loop.test": ["127.0.0.1"]})
    for other in (Hop("mx2.loop.test", down, 5), Hop("unknown.loop.test", port, 5)):
        destination = _destination(other, Hop("mx1.loop.test", port, 10))
        with pytest.raises(ConnectFailed) as caught:
            await ClientConnection.open(destination, resolver, _OPTIONS, own=own)
        assert not isinstance(caught.value, LoopsBack)
        assert caught.value.reply.code == 451


async def test_hosts_as_preferred_as_this_node_or_less_are_not_sent_to() -> None:
    # RFC 5321 5.1: this node's most preferred entry cuts the list there, equal preferences
    # included, whatever order the equals come in; none left is a loop.
    port, other = free_port(), free_port()
    own = Listeners([("127.0.0.1", port)])
    resolver = _Addresses({"mx1.loop.test": ["127.0.0.1"], "unknown.loop.test": []})
    for hops in (
        (Hop("mx1.loop.test", port, 10), Hop("127.0.0.1", other, 20)),
        (Hop("127.0.0.1", other, 10), Hop("mx1.loop.test", port, 10)),
        (Hop("unknown.loop.test", port, 10), Hop("mx1.loop.test", port, 10), Hop("127.0.0.1", other, 30)),
    ):
        with pytest.raises(LoopsBack) as caught:
            await ClientConnection.open(_destination(*hops), resolver, _OPTIONS, own=own)
        assert caught.value.looped == f"mx1.loop.test [127.0.0.1]:{port}"
