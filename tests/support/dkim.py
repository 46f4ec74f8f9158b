"""Two independent DKIM verifiers, each asking only the test's own DNS server for keys.

* dkimpy's `dkim.verify`, whose `dnsfunc` asks the server through dnspython;
* OpenDKIM's `opendkim-testmsg` (Debian opendkim-tools). It resolves with the C library's
  stub resolver, which takes its servers from /etc/resolv.conf only, on port 53. So it runs
  in a mount namespace of its own (`unshare --mount`, as root: the tests are) whose
  /etc/resolv.conf names the test's server and nothing else, and the server listens on port
  53 of a loopback address of its own: no query can reach any other resolver.
"""

from __future__ import annotations

import errno
import random
import subprocess
from pathlib import Path

import dkim
import dns.message
import dns.query
import dns.rdatatype

from tests.support.dns import DnsServer, Zone
from tests.support.tools import require


def key_server(zone: Zone) -> DnsServer:
    """A DNS server for `zone` on port 53 of a random loopback address (127.x.y.z)."""
    chooser = random.Random()
    for _ in range(50):
        address = f"127.{chooser.randint(1, 254)}.{chooser.randint(1, 254)}.{chooser.randint(2, 254)}"
        try:
            return DnsServer(zone, address=address, port=53)
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
    raise RuntimeError("no free loopback address for a DNS server on port 53")


def dkimpy_verify(message: bytes, server: DnsServer) -> list[bool]:
    """dkimpy's verdict on each DKIM-Signature of `message`, top first."""

    def txt(name: bytes, timeout: int = 5) -> bytes:
        query = dns.message.make_query(name.decode("ascii"), dns.rdatatype.TXT)
        answer = dns.query.udp(query, server.address, timeout=timeout, port=server.port)
        for rrset in answer.answer:
            for record in rrset:
                return b"".join(record.strings)
        return b""

    def verify(index: int) -> bool:
        try:
            return bool(dkim.DKIM(message).verify(idx=index, dnsfunc=txt))
        except dkim.ValidationError:  # a body hash that differs is raised, not returned
            return False

    count = message.lower().count(b"\ndkim-signature:") + message.lower().startswith(b"dkim-signature:")
    return [verify(index) for index in range(count)]


def opendkim_verify(message: bytes, server: DnsServer, workdir: Path) -> subprocess.CompletedProcess[bytes]:
    """`opendkim-testmsg` on `message` (exit status 0 and no output: every signature good)."""
    assert server.port == 53, "the C resolver only asks port 53"
    binary = require("opendkim-testmsg")
    resolv = workdir / "resolv.conf"
    resolv.write_text(f"nameserver {server.address}\noptions attempts:1 timeout:2\n")
    script = f'mount --bind "{resolv}" /etc/resolv.conf && exec "{binary}" -t "{workdir}"'
    command = [require("unshare"), "--mount", "--propagation", "private", "sh", "-c", script]
    return subprocess.run(command, input=message, capture_output=True, timeout=30, check=False)
