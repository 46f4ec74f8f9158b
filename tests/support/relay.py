"""A TCP relay between a client under test and a real server, for the timings that a real
server shows only now and then, made to show every time. It forwards every byte as it comes,
and can be told to:

- `hold_at`: stop forwarding the client's commands from the first line that matches (the
  line and all that follows are kept from the server), and say so on `held`: a client
  killed just then has sent a command the server never acted on (an IMAP client stopped
  between `STORE +FLAGS (\\Deleted)` and `UID EXPUNGE`, say);
- `close_after`: pass the server's closing of a connection on to the client that many seconds
  late, whatever came before it delivered at once (a server that says BYE, then closes a
  moment later, as a busy one does).

Threads on 127.0.0.1 only; each connection the client opens gets its own to the server.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from types import TracebackType
from typing import Self

from tests.support.ports import free_port

HOST = "127.0.0.1"


class Relay:
    def __init__(self, server_port: int, *, hold_at: bytes | None = None, close_after: float = 0.0) -> None:
        self.server_port = server_port
        self.port = free_port()
        self.hold_at = re.compile(hold_at, re.IGNORECASE) if hold_at is not None else None
        self.close_after = close_after
        self.held = threading.Event()  # a client line matched `hold_at`, and was kept from the server
        self.connections = 0
        self._listener = socket.create_server((HOST, self.port))
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> Self:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection((HOST, self.server_port), timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
                self.connections += 1
            threading.Thread(target=self._commands, args=(client, server), daemon=True).start()
            threading.Thread(target=self._answers, args=(server, client), daemon=True).start()

    def _commands(self, client: socket.socket, server: socket.socket) -> None:
        """Client to server, line by line when holding at a pattern."""
        pending = b""
        holding = False
        while True:
            data = _received(client)
            if not data:
                with contextlib.suppress(OSError):
                    server.shutdown(socket.SHUT_WR)
                return
            if holding:
                continue
            if self.hold_at is None:
                with contextlib.suppress(OSError):
                    server.sendall(data)
                continue
            pending += data
            *lines, pending = pending.split(b"\r\n")
            for index, line in enumerate(lines):
                if self.hold_at.search(line):
                    sent = b"".join(earlier + b"\r\n" for earlier in lines[:index])
                    with contextlib.suppress(OSError):
                        server.sendall(sent)
                    holding = True
                    self.held.set()
                    break
            else:
                with contextlib.suppress(OSError):
                    server.sendall(b"".join(line + b"\r\n" for line in lines))

    def _answers(self, server: socket.socket, client: socket.socket) -> None:
        """Server to client; the server's close passed on `close_after` seconds late."""
        while True:
            data = _received(server)
            if not data:
                break
            try:
                client.sendall(data)
            except OSError:
                break
        if self.close_after:
            time.sleep(self.close_after)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            client.close()


def _received(sock: socket.socket) -> bytes:
    """What `sock` reads next; b"" once it is closed or broken, either way the end."""
    try:
        return sock.recv(65536)
    except OSError:
        return b""
