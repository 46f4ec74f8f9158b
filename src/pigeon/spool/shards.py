"""Spool shards: one spool directory per worker process, `shard-<n>` under `[spool] path`.

Worker `w` of `N` writes new mail to shard `w`. Shards left by a run with more workers
(`n >= N`) are adopted by worker `n % N`, which recovers them and (with delivery) drains
them, so lowering the worker count never strands a message.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

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
