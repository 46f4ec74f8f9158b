"""Maildir: each message written to tmp/, fsynced, then linked into new/.

The file name is the dedupe key, so a message handed over twice lands once: if it is already
in new/ (or was moved to cur/ by a reader), the second handoff is accepted and writes nothing.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Handoff, Target, Verdict


class MaildirTarget(Target):
    kind = "maildir"

    def __init__(self, name: str, path: Path) -> None:
        super().__init__(name, concurrency=4)
        self.path = path

    async def start(self) -> None:
        await asyncio.to_thread(self._make_directories)

    def _make_directories(self) -> None:
        for sub in ("tmp", "new", "cur"):
            (self.path / sub).mkdir(parents=True, exist_ok=True)

    async def deliver(self, message: InboundMessage) -> Handoff:
        try:
            return await asyncio.to_thread(self._write, message)
        except OSError as error:
            return Handoff(Verdict.TRANSIENT, f"maildir {self.path}: {error.strerror or error}")

    def _write(self, message: InboundMessage) -> Handoff:
        name = f"pigeon.{message.dedupe_key}"
        new = self.path / "new" / name
        if new.exists() or any((self.path / "cur").glob(f"{name}:*")) or (self.path / "cur" / name).exists():
            return Handoff(Verdict.ACCEPTED, "duplicate: already in the maildir")
        self._make_directories()
        tmp = self.path / "tmp" / f"{name}.{os.getpid()}"
        with open(tmp, "wb") as file:
            file.write(message.raw)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(tmp, new)
        except FileExistsError:
            pass  # another node wrote it meanwhile: the same bytes
        finally:
            tmp.unlink()
        directory = os.open(self.path / "new", os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return Handoff(Verdict.ACCEPTED, f"new/{name}")
