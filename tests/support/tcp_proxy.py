"""A TCP proxy on loopback that a test can cut and restore: one node's way to a shared server
(Redis) goes away while the server, and every other node's way to it, stays up; or a node's way
to its IMAP server goes away at the very command a test is about (`cut_at`)."""

from __future__ import annotations

import contextlib
import queue
import re
import socket
import threading
import time
from types import TracebackType
from typing import Self

from tests.support.ports import free_port

HOST = "127.0.0.1"


class TcpProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`server_port`. `cut()` closes every connection
    through it and refuses new ones (as a host cut off would: connection refused); `restore()`
    accepts again on the same port. `freeze()` drops whatever goes through, either way, while
    every connection stays open and new ones are accepted (packets dropped, not refused: each
    call waits out its timeout); `thaw()` forwards again. `delay`: seconds each chunk waits
    before it is forwarded, either way (a slow way to the server; order is kept). `cut_at`: a
    pattern of what the client sends; the first time it shows, the proxy cuts (as `cut()`)
    before forwarding it, so the server never gets that command, and sets `was_cut`. Set
    `cut_at` to None before `restore()` for the way to stay open."""

    def __init__(self, server_port: int, *, cut_at: bytes | None = None) -> None:
        self.server_port = server_port
        self.cut_at = re.compile(cut_at) if cut_at is not None else None
        self.was_cut = threading.Event()
        self.port = free_port()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._frozen = False
        self.delay = 0.0

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def __enter__(self) -> Self:
        self.restore()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.cut()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, self.port))
        listener.listen(64)
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def freeze(self) -> None:
        self._frozen = True

    def thaw(self) -> None:
        self._frozen = False

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
        for sock in [*([listener] if listener else []), *sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                server = socket.create_connection((HOST, self.server_port), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    server.close()
                    return
                self._sockets |= {client, server}
            for source, destination, watched in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(source, destination, watched), daemon=True).start()

    def _pump(self, source: socket.socket, destination: socket.socket, watched: bool) -> None:
        """`watched`: the client's side, where `cut_at` is looked for."""
        delayed: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()
        sender = threading.Thread(target=self._send_delayed, args=(delayed, destination), daemon=True)
        sender.start()
        tail = b""  # the end of what came before: a command may come in two pieces
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                pattern = self.cut_at if watched else None
                if pattern is not None:
                    if pattern.search(tail + data):
                        self.was_cut.set()
                        self.cut()
                        break
                    tail = (tail + data)[-1024:]
                if not self._frozen:
                    delayed.put((time.monotonic() + self.delay, data))
        delayed.put((0.0, b""))  # (the sender ends, once it has sent what came before)
        sender.join()
        for sock in (source, destination):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    @staticmethod
    def _send_delayed(delayed: queue.SimpleQueue[tuple[float, bytes]], destination: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                due, data = delayed.get()
                if not data:
                    return
                time.sleep(max(0.0, due - time.monotonic()))
                destination.sendall(data)
