"""Listening sockets bound once by the node's main process, then served by whoever inherits them.

`pigeon serve` binds one socket per address (before a privilege drop, if any) and every
worker accepts on it: a user cannot bind port 25 again, a worker that is restarted keeps
serving the same socket (the supervisor holds it open), and a stopped worker leaves its
share of new clients to the others. No SO_REUSEPORT: with it a second node on the same port
would bind too and take half the connections; without it, it fails with "address in use".
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Final

_BACKLOG = 4096


HTTP_ADDRESS_FILE: Final = "http-address"
"""In the spool directory: the address the running node's HTTP listener was bound to, for the
`pigeon` command to find it when the config file names another ([http] listen edited and
reloaded: it takes effect at the next restart) or a port 0 (picked by the kernel)."""


def record_http_address(spool_path: Path, sock: socket.socket) -> None:
    """Write where `sock` listens ("127.0.0.1:8025", "[::1]:8025") to `HTTP_ADDRESS_FILE`,
    whole or not at all. Mode 0600, as every file Pigeon writes (README): it is written before
    `pigeon serve` sets its umask 077 (which must not apply to the spool's parents it makes)."""
    host, port = sock.getsockname()[:2]
    text = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    spool_path.mkdir(parents=True, exist_ok=True)
    temporary = spool_path / f".{HTTP_ADDRESS_FILE}.tmp"
    try:
        temporary.unlink(missing_ok=True)  # (one a crash left, of another mode)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(text + "\n")
        os.replace(temporary, spool_path / HTTP_ADDRESS_FILE)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


def recorded_http_address(spool_path: Path) -> str | None:
    """What `record_http_address` wrote last ("host:port"), or None."""
    try:
        return (spool_path / HTTP_ADDRESS_FILE).read_text().strip() or None
    except OSError:
        return None


class ListenError(OSError):
    """A listener could not bind its address; the message names the config key."""


@dataclass(slots=True)
class Bound:
    """The sockets bound before the drop: SMTP (one per address and family) and HTTP."""

    smtp: list[socket.socket]
    http: list[socket.socket]

    def close(self) -> None:
        for sock in (*self.smtp, *self.http):
            sock.close()


def bind(host: str, port: int, *, listen: bool = True) -> list[socket.socket]:
    """Listening TCP sockets for `host:port` (a name may give IPv4 and IPv6), as asyncio's
    `create_server` binds them. Raises `OSError`, with every socket made so far closed.

    `listen=False`: bound only; whoever serves them listens (`create_server(sock=...)` does).
    Until then a client is refused at once, where a listening socket nobody accepts on would
    complete its handshake and leave it waiting for a greeting (a node waiting for room on a
    full spool disk may wait hours). Another node listening on the port still makes the bind
    fail: SO_REUSEADDR does not reach past a listening socket."""
    made: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, protocol, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, protocol)
            made.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            if listen:
                sock.listen(_BACKLOG)
            # Not inheritable (Python's default), though workers inherit it: the supervisor
            # names it in `pass_fds`, which hands it to that one child. Inheritable, every
            # child would get it (uvloop's spawn does no `close_fds`): the workers the HTTP
            # listener, a worker's DKIM signing process every listener.
    except OSError:
        for sock in made:
            sock.close()
        raise
    return made


def adopt(fds: list[int]) -> list[socket.socket]:
    """The sockets a parent process passed down by descriptor number, made not inheritable
    again (`pass_fds` left them so): a child of this process, its DKIM signing process, must
    not hold the node's listeners (see `bind`)."""
    adopted = [socket.socket(fileno=fd) for fd in fds]
    for sock in adopted:
        sock.set_inheritable(False)
    return adopted
