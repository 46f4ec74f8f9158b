"""Spool shards: one spool directory per worker process, `shard-<n>` under `[spool] path`.

Worker `w` of `N` writes new mail to shard `w`. Shards left by a run with more workers
(`n >= N`) are adopted by worker `n % N`, which recovers them and (with delivery) drains
them, so lowering the worker count never strands a message. An id carries the shard that
made it (`pigeon.message.shard_of`), so `Spools.of()` finds any message's shard.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Final

from pigeon.message import Message, shard_of
from pigeon.spool.spool import Spool

_SHARD: Final = re.compile(r"shard-(\d+)")


def shard_directory(root: Path, shard: int) -> Path:
    return root / f"shard-{shard}"


def existing_shards(root: Path) -> list[int]:
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _SHARD.fullmatch(path.name)
        if match and path.is_dir():
            found.append(int(match.group(1)))
    return sorted(found)


def adopted_shards(root: Path, worker: int, workers: int) -> list[int]:
    """Shards beyond the worker count that worker `worker` takes over."""
    return [s for s in existing_shards(root) if s >= workers and s % workers == worker]


class Spools(Mapping[int, Spool]):
    """A worker's spool shards (its own and any it adopted), and which one holds an id."""

    def __init__(self, spools: Iterable[Spool]) -> None:
        self._by_shard = {spool.shard: spool for spool in spools}

    def __getitem__(self, shard: int) -> Spool:
        return self._by_shard[shard]

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_shard)

    def __len__(self) -> int:
        return len(self._by_shard)

    def of(self, spool_id: int) -> Spool:
        """The shard holding message `spool_id` (KeyError if it is not one of ours)."""
        return self._by_shard[shard_of(spool_id)]

    def body(self, message: Message) -> bytes:
        """A message's body as stored: the copy it carries in memory, or its shard's."""
        if message.data is not None:
            return message.data
        return self.of(message.id).body(message.body_id)
