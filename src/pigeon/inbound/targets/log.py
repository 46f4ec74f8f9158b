"""Log: one JSON line per message in a file (headers, dedupe key and the raw message).

For development and audits. A batch of messages is one write and one fsync: each line is on
disk before its message counts as accepted, and a mailbox acknowledges nothing before that.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Handoff, Target, Verdict
from pigeon.inbound.targets.webhook import json_body


class LogTarget(Target):
    kind = "log"
    batches = True

    def __init__(self, name: str, path: Path) -> None:
        super().__init__(name, concurrency=1)
        self.path = path
        self._lock = asyncio.Lock()

    async def deliver(self, message: InboundMessage) -> Handoff:
        return (await self.deliver_many([message]))[0]

    async def deliver_many(self, messages: Sequence[InboundMessage]) -> list[Handoff]:
        if not messages:
            return []
        lines = b"".join([json_body(message) + b"\n" for message in messages])
        try:
            async with self._lock:
                await asyncio.to_thread(self._append, lines)
        except OSError as error:
            # Some lines may have reached the file: handed over again later, they carry the
            # same dedupe keys.
            failed = Handoff(Verdict.TRANSIENT, f"log {self.path}: {error.strerror or error}")
            return [failed] * len(messages)
        return [Handoff(Verdict.ACCEPTED, f"written to {self.path}")] * len(messages)

    def _append(self, lines: bytes) -> None:
        # Opened for each batch, not kept: a file moved away (rotated) is written anew.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as file:
            file.write(lines)
            file.flush()
            os.fsync(file.fileno())
