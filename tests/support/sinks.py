"""Receiving ends for delivery tests: Postfix's smtp-sink, and a scripted aiosmtpd sink.

The scripted sink answers by recipient local part, like KumoMTA's test sink:

    ok@...          250
    tempfail@...    451 4.3.0 at RCPT
    permfail@...    550 5.1.1 at RCPT
    quota@...       552 5.2.2 mailbox full, at RCPT
    datafail@...    554 5.6.0 at end of data (the whole transaction)
    datatemp@...    451 4.3.0 at end of data
    slow@...        waits `slow` seconds before answering RCPT
    flaky@...       451 4.3.0 at RCPT for its first `flaky` tries, then 250
    hangup@...      drops the connection in the middle of DATA
    chaos*@...      at random (seeded), per recipient: 451 at RCPT (25%), 550 at RCPT (3%); per
                    message: a hang-up in the middle of DATA (4%), or the message taken and the
                    connection dropped before the 250 (2%: the one case where the sender may
                    rightly deliver it again)
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import time
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message as EmailMessage
from email.policy import default as default_policy
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from tests.support.process import free_port
from tests.support.tools import require


class SmtpSink:
    """`smtp-sink` on a free loopback port; `extra` are its fault options (-r, -f, -q ...)."""

    def __init__(self, *extra: str, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.host = host
        self.port = port or free_port()
        binary = require("/usr/sbin/smtp-sink")
        self.process = subprocess.Popen(
            [binary, "-u", "nobody", "-c", *extra, f"{host}:{self.port}", "256"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(host, self.port)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def __enter__(self) -> SmtpSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Received:
    sender: str
    recipients: list[str]
    data: bytes
    mail_options: list[str] = field(default_factory=list)
    rcpt_options: list[list[str]] = field(default_factory=list)
    dropped: bool = False  # chaos@: stored, but the connection was dropped before the 250

    @property
    def email(self) -> EmailMessage:
        return message_from_bytes(self.data, policy=default_policy)  # type: ignore[return-value]


class _Handler:
    def __init__(self, sink: ScriptedSink) -> None:
        self.sink = sink

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        local = address.split("@", 1)[0].lower()
        self.sink.rcpt_log.append(address)
        if local == "slow":
            await asyncio.sleep(self.sink.slow)
        if local == "flaky" and self.sink.rcpt_log.count(address) <= self.sink.flaky:
            return "451 4.3.0 not yet"
        if local.startswith("chaos"):
            roll = self.sink.random.random()
            if roll < 0.25:
                return "451 4.3.0 chaos says later"
            if roll < 0.28:
                return "550 5.1.1 chaos says no"
        reply = {
            "tempfail": "451 4.3.0 try again later",
            "permfail": "550 5.1.1 no such user here",
            "quota": "552 5.2.2 mailbox full",
        }.get(local)
        if reply is not None:
            return reply
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.append(options)
        return "250 2.1.5 recipient ok"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        locals_ = {r.split("@", 1)[0].lower() for r in envelope.rcpt_tos}
        if "datafail" in locals_:
            return "554 5.6.0 content rejected"
        if "datatemp" in locals_:
            return "451 4.3.0 content deferred"
        data = envelope.original_content or b""
        received = Received(
            envelope.mail_from or "",
            list(envelope.rcpt_tos),
            data,
            list(envelope.mail_options),
            [list(o) for o in envelope.rcpt_options],
        )
        self.sink.received.append(received)
        if any(local.startswith("chaos") for local in locals_) and self.sink.random.random() < 0.02:
            received.dropped = True  # taken, but the sender never hears the 250
            server.transport.close()
        return "250 2.0.0 stored"


class _HangupSMTP(SMTP):
    """Drops the connection in the middle of DATA when a recipient is hangup@."""

    async def smtp_DATA(self, arg: str) -> None:
        chaos = any(r.lower().startswith("chaos") for r in self.envelope.rcpt_tos)
        random_hangup = chaos and self.event_handler.sink.random.random() < 0.04
        if random_hangup or any(r.lower().startswith("hangup@") for r in self.envelope.rcpt_tos):
            await self.push("354 End data with <CR><LF>.<CR><LF>")
            await self._reader.readline()
            self.transport.close()
            return
        await super().smtp_DATA(arg)


class _Controller(Controller):
    def factory(self) -> SMTP:
        return _HangupSMTP(self.handler, **self.SMTP_kwargs)


class ScriptedSink:
    """An aiosmtpd server in a thread, answering by recipient (see the module docstring)."""

    def __init__(
        self, *, host: str = "127.0.0.1", port: int | None = None, slow: float = 0.0, flaky: int = 2, seed: int = 1
    ) -> None:
        self.host = host
        self.random = random.Random(seed)
        self.port = port or free_port()
        self.slow = slow
        self.flaky = flaky
        self.received: list[Received] = []
        self.rcpt_log: list[str] = []
        self._controller = _Controller(_Handler(self), hostname=host, port=self.port, ready_timeout=10)
        self._controller.start()

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Received]:
        """The messages received, once there are at least `count`; fails when time runs out."""
        deadline = time.monotonic() + timeout
        while len(self.received) < count:
            if time.monotonic() >= deadline:
                raise AssertionError(f"the sink received {len(self.received)} messages in {timeout}s, not {count}")
            time.sleep(0.05)
        return list(self.received)

    def after(self, seconds: float) -> list[Received]:
        """What was received after `seconds` more (to show that nothing more came)."""
        time.sleep(seconds)
        return list(self.received)

    def stop(self) -> None:
        self._controller.stop()

    def __enter__(self) -> ScriptedSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_port(host: str, port: int, timeout: float = 10.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port}")


def delivery_config(next_hop: str, **delivery: Any) -> dict[str, dict[str, Any]]:
    """Sections for PigeonProcess: deliver everything to `next_hop`, retry fast."""
    settings: dict[str, Any] = {
        "enabled": True,
        "retry_interval": "1s",
        "max_retry_interval": "2s",
        "idle_timeout": "2s",
    }
    settings.update(delivery)
    return {"delivery": settings, "route": [{"domain": "*", "next_hop": next_hop, "tls": "disabled"}]}


def wait_until(predicate: Any, timeout: float = 20.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")
