"""The mail of the realistic relay benchmark, and the injector that submits it to an MTA.

Messages of mixed size (log-normal, median 20 KiB, a tail to 500 KiB; above 64 KiB a
multipart message with a base64 attachment) with 1 to 5 recipients each, in domains drawn by
the zone's popularity. Every recipient address is its own (`u<message>.<n>@domain`), so the
sinks' choice of 250/450/550 is one per (Message-ID, recipient). The same seed gives every
contender the same mail.

smtp-source sends one kind of message to one recipient, so the injector is ours: a few
concurrent SMTP sessions, PIPELINING where offered, bodies written as slices of two pools
built once, so that it spends little of the CPU it shares with the MTA under test.
"""

from __future__ import annotations

import asyncio
import base64
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from world import SENDER, Zone, message_id

MEDIAN = 20 * 1024
LARGEST = 500 * 1024
_LINE = 78  # 76 characters and CRLF
_ATTACH_ABOVE = 64 * 1024
_COUNTS = (1, 2, 3, 4, 5)
_COUNT_WEIGHTS = (50, 20, 15, 10, 5)


@dataclass(frozen=True, slots=True)
class Message:
    number: int
    recipients: tuple[str, ...]
    size: int


def workload(count: int, zone: Zone, seed: int = 7) -> list[Message]:
    rng = random.Random(seed)
    messages = []
    for number in range(count):
        size = int(min(LARGEST, max(1024, rng.lognormvariate(0, 0.9) * MEDIAN)))
        n = rng.choices(_COUNTS, _COUNT_WEIGHTS)[0]
        domains = rng.choices(zone.domains, zone.weights, k=n)
        messages.append(Message(number, tuple(f"u{number}.{i}@{d}" for i, d in enumerate(domains)), size))
    return messages


class Bodies:
    """Text and base64 lines, LARGEST bytes of each, sliced into messages (no line starts with a
    dot: nothing to stuff)."""

    def __init__(self, seed: int = 7) -> None:
        rng = random.Random(seed)
        words = [
            "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(500)
        ]
        lines = []
        for _ in range(LARGEST // _LINE + 1):
            line = " ".join(rng.choices(words, k=14))
            lines.append(line[:76].ljust(76, "x").encode() + b"\r\n")
        self.text = memoryview(b"".join(lines))
        raw = base64.encodebytes(rng.randbytes(LARGEST * 3 // 4 + 100)).replace(b"\n", b"\r\n")
        self.base64 = memoryview(raw[: len(raw) // _LINE * _LINE])

    def parts(self, message: Message) -> list[bytes | memoryview]:
        """The message's data, ending with CRLF, without the final dot."""
        n = message.number
        head = (
            f"From: Newsletter <{SENDER}>\r\nTo: {', '.join(message.recipients)}\r\n"
            f"Subject: Bench message {n}\r\nDate: Mon, 1 Dec 2025 12:00:00 +0000\r\n"
            f"Message-ID: {message_id(n)}\r\nMIME-Version: 1.0\r\n"
        ).encode()
        start = (n * 7919 % 1000) * _LINE  # a different slice for each message
        if message.size <= _ATTACH_ABOVE:
            lines = max(1, (message.size - len(head)) // _LINE)
            start %= len(self.text) - lines * _LINE + 1
            text = self.text[start // _LINE * _LINE :][: lines * _LINE]
            return [head + b"Content-Type: text/plain; charset=us-ascii\r\n\r\n", text]
        boundary = f"=_part_{n}".encode()
        lines = min((message.size - 4096) // _LINE, len(self.base64) // _LINE)
        start %= len(self.base64) - lines * _LINE + 1
        attached = self.base64[start // _LINE * _LINE :][: lines * _LINE]
        opening = (
            head + b'Content-Type: multipart/mixed; boundary="' + boundary + b'"\r\n\r\n'
            b"--" + boundary + b"\r\nContent-Type: text/plain; charset=us-ascii\r\n\r\n"
            + bytes(self.text[: 26 * _LINE])
            + b"--" + boundary + b"\r\nContent-Type: application/pdf; name=\"report.pdf\"\r\n"
            b"Content-Transfer-Encoding: base64\r\nContent-Disposition: attachment; filename=\"report.pdf\"\r\n\r\n"
        )  # fmt: skip
        return [opening, attached, b"--" + boundary + b"--\r\n"]


@dataclass
class Injected:
    accepted: list[Message] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # "message n: reply"
    data_to_reply: list[float] = field(default_factory=list)  # seconds from a message's data to its 250
    seconds: float = 0.0


async def _reply(reader: asyncio.StreamReader) -> bytes:
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("the MTA closed the connection")
        if line[3:4] != b"-":
            return line


async def _session(port: int, todo: Iterator[Message], bodies: Bodies, per_connection: int, done: Injected) -> None:
    loop = asyncio.get_running_loop()
    message = next(todo, None)
    while message is not None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await _reply(reader)
        writer.write(b"EHLO injector.src.test\r\n")
        pipelining = False
        while True:
            line = await reader.readline()
            pipelining |= line[4:].strip().upper() == b"PIPELINING"
            if line[3:4] != b"-":
                break
        sent = 0
        while message is not None and sent < per_connection:
            commands = [f"MAIL FROM:<{SENDER}>\r\n".encode()]
            commands += [f"RCPT TO:<{r}>\r\n".encode() for r in message.recipients]
            commands.append(b"DATA\r\n")
            replies = []
            if pipelining:
                writer.write(b"".join(commands))
                replies = [await _reply(reader) for _ in commands]
            else:
                for command in commands:
                    writer.write(command)
                    replies.append(await _reply(reader))
            if not replies[-1].startswith(b"354") or any(not r.startswith(b"250") for r in replies[:-1]):
                # Not expected of a relay for its own network; such a message is left out of what
                # the sinks should see, and the bench fails.
                done.failures.append(f"message {message.number}: {b' / '.join(r.strip() for r in replies)!r}")
            if replies[-1].startswith(b"354"):
                started = loop.time()
                writer.writelines([*bodies.parts(message), b".\r\n"])
                await writer.drain()
                final = await _reply(reader)
                done.data_to_reply.append(loop.time() - started)
                if not final.startswith(b"250"):
                    done.failures.append(f"message {message.number}: {final.strip()!r}")
                elif all(r.startswith(b"250") for r in replies[:-1]):
                    done.accepted.append(message)
            sent += 1
            message = next(todo, None)
        writer.write(b"QUIT\r\n")
        await _reply(reader)
        writer.close()


async def inject(
    port: int, messages: list[Message], bodies: Bodies, sessions: int = 8, per_connection: int = 100
) -> Injected:
    """Submit `messages` over `sessions` concurrent connections of up to `per_connection` messages."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    done = Injected()
    todo = iter(messages)
    await asyncio.gather(*(_session(port, todo, bodies, per_connection, done) for _ in range(sessions)))
    done.seconds = loop.time() - started
    return done
