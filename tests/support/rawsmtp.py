"""A deliberately dumb SMTP client for tests: sends exactly the bytes it is given.

swaks and smtplib normalise what they send; smuggling, BDAT and malformed input need a
client that does not.
"""

from __future__ import annotations

import socket
import ssl


class RawSmtp:
    def __init__(self, port: int, *, timeout: float = 10.0, source: str | None = None) -> None:
        """`source`: the loopback address to connect from (127.0.0.1 if none)."""
        self.sock: socket.socket | ssl.SSLSocket = socket.create_connection(
            ("127.0.0.1", port), timeout=timeout, source_address=(source, 0) if source else None
        )
        self._buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reply(self) -> tuple[int, list[str]]:
        """Read one (possibly multi-line) reply: its code and its text lines."""
        lines: list[str] = []
        while True:
            line = self._line()
            lines.append(line[4:])
            if len(line) < 4 or line[3] != "-":
                return int(line[:3]), lines

    def command(self, line: str | bytes) -> tuple[int, list[str]]:
        self.send((line.encode() if isinstance(line, str) else line) + b"\r\n")
        return self.reply()

    def expect(self, code: int, line: str | bytes | None = None) -> list[str]:
        got, text = self.reply() if line is None else self.command(line)
        assert got == code, f"expected {code}, got {got} {text}"
        return text

    def starttls(self) -> None:
        self.expect(220, "STARTTLS")
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        self.sock = context.wrap_socket(self.sock)

    def closed_by_peer(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, TimeoutError):
            return True

    def close(self) -> None:
        self.sock.close()

    def _line(self) -> str:
        while b"\r\n" not in self._buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"connection closed; unread: {self._buf!r}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\r\n", 1)
        return line.decode("utf-8")

    def __enter__(self) -> RawSmtp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
