"""Log: one JSON line per message in a file (headers, dedupe key and the raw message).

For development and audits. Each line is written and fsynced before the message counts as
accepted.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Handoff, Target, Verdict
from pigeon.inbound.targets.webhook import json_body


class LogTarget(Target):
    kind = "log"

    def __init__(self, name: str, path: Path) -> None:
        super().__init__(name, concurrency=1)
        self.path = path
        self._lock = asyncio.Lock()

    async def deliver(self, message: InboundMessage) -> Handoff:
        line = json_body(message) + b"\n"
        try:
            async with self._lock:
                await asyncio.to_thread(self._append, line)
        except OSError as error:
            return Handoff(Verdict.TRANSIENT, f"log {self.path}: {error.strerror or error}")
        return Handoff(Verdict.ACCEPTED, f"written to {self.path}")

    def _append(self, line: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as file:
            file.write(line)
            file.flush()
            os.fsync(file.fileno())
