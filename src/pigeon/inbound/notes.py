"""A mailbox's note: the last problem a node saw on it, for the operator of any node to read.

Every node watching a mailbox sees it from its own side: one node cannot log in (a password
file not updated there), another's network cannot reach the server, a third is fine. Each
node's `/healthz` says only what that node sees; the note says what the last node in trouble
saw, on every node. It is one Redis key per mailbox, `<prefix>:inbound:<mailbox>:note`
(`<mailbox>` its identity, `user@host:port/folder`, the same on every node), holding JSON:
`problem` (redacted, as `/healthz`'s `error`), `node` (its `[node] name`), `at` (Unix time) and
`resolved_at` (when that node found the mailbox working again; null while it does not). A
note is kept for `NOTE_TTL` after it was written.

Without Redis, a node's notes live in its memory: its own `/healthz` shows them, which it
does anyway. A note that cannot be written (Redis away: often the very problem) is written
once Redis answers, unless a newer one replaced it meanwhile. Nothing here ever raises to
the watcher: notes are advice, never in the way of mail.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Final

import msgspec

_log = logging.getLogger(__name__)

NOTE_TTL: Final = 7 * 24 * 3600  # seconds a note is kept after it was written
# Marks a note resolved only if it is still the one this node wrote: a newer note, another
# node's, is left alone.
_RESOLVE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
end
return false
"""


class NotesUnavailable(Exception):
    """The store of notes did not answer; the note is written later."""


@dataclass(frozen=True, slots=True)
class Note:
    """The last problem a node saw on a mailbox."""

    problem: str
    node: str
    at: float
    resolved_at: float | None = None

    def encode(self) -> bytes:
        return msgspec.json.encode(dataclasses.asdict(self))

    @classmethod
    def decode(cls, data: bytes | str) -> Note | None:
        """The note in `data`; None for anything else (a key an operator set by hand, say)."""
        try:
            fields = msgspec.json.decode(data)
            return cls(str(fields["problem"]), str(fields["node"]), float(fields["at"]),
                       None if fields.get("resolved_at") is None else float(fields["resolved_at"]))  # fmt: skip
        except (msgspec.DecodeError, KeyError, TypeError, ValueError):
            return None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def note_key(identity: str) -> str:
    """The key of a mailbox's note (before the configured prefix)."""
    return f"inbound:{identity}:note"


class Notes:
    """Notes in this process's memory: single-node mode."""

    def __init__(self) -> None:
        self._notes: dict[str, Note] = {}

    async def write(self, identity: str, note: Note) -> None:
        self._notes[identity] = note

    async def resolve(self, identity: str, note: Note, at: float) -> None:
        """Mark `note` resolved at `at`, if it is still the mailbox's note."""
        if self._notes.get(identity) == note:
            self._notes[identity] = dataclasses.replace(note, resolved_at=at)

    async def read(self, identity: str) -> Note | None:
        return self._notes.get(identity)

    async def close(self) -> None:
        pass


class RedisNotes(Notes):
    """Notes in the Redis the nodes arbitrate through, seen by every node."""

    def __init__(self, url: str, *, prefix: str = "pigeon", timeout: float = 2.0) -> None:
        super().__init__()
        self._prefix = f"{prefix}:" if prefix else ""
        # Imported here, not with the module: a node without Redis keeps no notes and need
        # not spend a tenth of a second on the Redis client.
        import redis.asyncio as aioredis
        from redis.exceptions import RedisError

        # What a call raises when Redis does not answer.
        self._unavailable: tuple[type[Exception], ...] = (RedisError, OSError)
        self._redis = aioredis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self._resolve = self._redis.register_script(_RESOLVE)

    def _key(self, identity: str) -> str:
        return self._prefix + note_key(identity)

    async def write(self, identity: str, note: Note) -> None:
        try:
            await self._redis.set(self._key(identity), note.encode(), ex=NOTE_TTL)
        except self._unavailable as error:
            raise NotesUnavailable(str(error)) from error

    async def resolve(self, identity: str, note: Note, at: float) -> None:
        resolved = dataclasses.replace(note, resolved_at=at)
        try:
            await self._resolve(keys=[self._key(identity)], args=[note.encode(), resolved.encode()])
        except self._unavailable as error:
            raise NotesUnavailable(str(error)) from error

    async def read(self, identity: str) -> Note | None:
        try:
            data = await self._redis.get(self._key(identity))
        except self._unavailable as error:
            raise NotesUnavailable(str(error)) from error
        return None if data is None else Note.decode(data)

    async def close(self) -> None:
        await self._redis.aclose()
