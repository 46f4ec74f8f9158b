"""Whether an address and port Pigeon is about to connect to is one of this node's own SMTP listeners.

An MX (or a `[[route]]`'s `next_hop`) that points back at the node itself would have it hand
each message to itself, accept it again and queue it again, until `[smtp] max_hops` refuses
it: a hundred Reception and Delivery records for one bounce, each Delivery saying "delivered"
of mail that in the end was not. Postfix checks for this before connecting ("mail for <domain>
loops back to myself"), and so does Pigeon (`session.ClientConnection.open`): such a host is
not connected to, and when no other host is left the mail fails for good with `554 5.4.6`.

Only the exact address and port of a listener count, so nodes relaying to each other on one
machine (different ports, or different loopback addresses on one port) are no loop. A
wildcard listener (`0.0.0.0`, `::`) takes connections to every local address of its family
(the listeners bind IPv6 sockets IPv6-only): loopback (127.0.0.0/8, ::1; the unspecified
address, which a connection takes for loopback), and any address of the machine's interfaces, which
the kernel's routing tells apart: a UDP socket "connected" to a local address (no packet is
sent) gets that same address as its own, another address never does.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Iterable
from typing import Final

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_LOOPBACK: Final[dict[int, IpAddress]] = {4: ipaddress.IPv4Address("127.0.0.1"), 6: ipaddress.IPv6Address("::1")}
_LOCAL_TTL: Final = 60.0  # how long whether an address is the machine's is remembered (interfaces change)


def parse_address(text: str) -> IpAddress | None:
    """`text` as an IP address (an IPv4-mapped IPv6 one as its IPv4 address, a zone index dropped);
    None if it is not one (a host name)."""
    try:
        address = ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _kernel_says_local(address: IpAddress) -> bool:
    """Whether `address` is one of the machine's own: the kernel routes a datagram to a local
    address from that same address. No packet is sent (a UDP connect only picks the route)."""
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((str(address), 9))
            own = probe.getsockname()[0]
    except OSError:  # no route to it (or no IPv6 at all): not ours
        return False
    return parse_address(own) == address


class Listeners:
    """This node's SMTP listeners: `is_self(address, port)` says whether connecting there
    reaches this node. Set from `[smtp] listen` at start (`replace`), then from the addresses
    the listeners bound (a port 0 picks one)."""

    def __init__(
        self,
        endpoints: Iterable[tuple[str, int]] = (),
        *,
        is_local: Callable[[IpAddress], bool] = _kernel_says_local,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._exact: set[tuple[IpAddress, int]] = set()
        self._wildcard: dict[int, set[int]] = {}  # port -> IP versions listened to on every address
        self._is_local = is_local
        self._clock = clock
        self._local: dict[IpAddress, tuple[float, bool]] = {}
        self.replace(endpoints)

    def replace(self, endpoints: Iterable[tuple[str, int]]) -> None:
        """The listeners are these (host, port) pairs from now on. A port 0 (not bound yet) is
        none; a host name is none but "localhost", which is loopback."""
        exact: set[tuple[IpAddress, int]] = set()
        wildcard: dict[int, set[int]] = {}
        for host, port in endpoints:
            if port == 0:
                continue
            if host.lower() == "localhost":
                addresses: list[IpAddress] = [_LOOPBACK[4], _LOOPBACK[6]]
            else:
                address = parse_address(host)
                if address is None:
                    continue
                addresses = [address]
            for address in addresses:
                if address.is_unspecified:
                    wildcard.setdefault(port, set()).add(address.version)
                else:
                    exact.add((address, port))
        self._exact, self._wildcard = exact, wildcard

    def is_self(self, host: str, port: int) -> bool:
        """Whether a connection to `host` (an address) on `port` would reach one of this node's listeners."""
        address = parse_address(host)
        if address is None:
            return False
        if address.is_unspecified:  # a connection to 0.0.0.0 or :: goes to loopback
            address = _LOOPBACK[address.version]
        if (address, port) in self._exact:
            return True
        return address.version in self._wildcard.get(port, ()) and self._local_address(address)

    def _local_address(self, address: IpAddress) -> bool:
        if address.is_loopback:
            return True
        now = self._clock()
        known = self._local.get(address)
        if known is not None and known[0] > now:
            return known[1]
        local = self._is_local(address)
        if len(self._local) > 10_000:
            self._local.clear()
        self._local[address] = (now + _LOCAL_TTL, local)
        return local
