"""A node's standing rules (suspensions, bounces with a duration), as its supervisor keeps them
for its workers.

Each worker stores the rules it holds in its own spool shard, and an admin write reaches it
from the supervisor (`Supervisor._broadcast`). A worker that misses one (stopped, restarting,
killed by the watchdog) would go on without a suspension the others hold, or holding one the
others have ended, while the listings add up the workers' rules. So the supervisor keeps what
every write through it made and ended (`NodeRules`: the rules in force, and a tombstone for each
rule ended, as Redis keeps them for the nodes of a cluster, `pigeon.node.broadcast`), in a file
beside the spool shards that outlives a restart of the supervisor:

- a worker that starts takes them from that file (`take_node_rules`, `Admin.adopt`: matched
  by id, so taking one it holds already changes nothing) before it delivers anything;
- a worker that missed a write while it ran is handed them once it answers again
  (`POST /internal/rules` on its control socket, never on the public listener).

A worker that was merely slow, and applied the write late, holds the same rule under the same
id: taking it again changes nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import msgspec

from pigeon.fsync import fsync_directory
from pigeon.queue.rules import Rule

_log = logging.getLogger(__name__)

RULES_FILE: Final = "admin-rules.json"
INTERNAL_PATH: Final = "/internal/rules"
"""Where a worker takes its node's rules (its control socket only: no token is asked there)."""
_KEEP_ENDED: Final = 10_000  # tombstones kept at most: the latest


class Tombstone(msgspec.Struct):
    """A rule ended (cancelled, resumed): `kind`, and when it would have ended by itself (None:
    never; the tombstone may go after that)."""

    kind: str
    until: float | None = None


class Standing(msgspec.Struct):
    """The node's standing rules: those in force (id -> rule) and those ended (id -> tombstone)."""

    in_force: dict[str, Rule] = msgspec.field(default_factory=dict)
    ended: dict[str, Tombstone] = msgspec.field(default_factory=dict)

    def for_adopt(self, now: float) -> tuple[list[Rule], dict[str, str]]:
        """What `Admin.adopt` takes: the live rules, and the ids ended (id -> kind)."""
        live = [rule for rule in self.in_force.values() if rule.live(now)]
        return live, {rule_id: tomb.kind for rule_id, tomb in self.ended.items()}


_DECODER: Final = msgspec.json.Decoder(Standing)


def node_rules_path(spool: Path) -> Path:
    return spool / RULES_FILE


def decode(blob: bytes) -> Standing:
    return _DECODER.decode(blob)


def encode(standing: Standing) -> bytes:
    return msgspec.json.encode(standing)


class NodeRules:
    """What the writes through this supervisor made and ended, kept in `path`."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self.standing = Standing()
        try:
            self.standing = decode(path.read_bytes())
        except FileNotFoundError:
            pass  # none made through here yet
        except (OSError, msgspec.DecodeError) as error:
            _log.error("admin rules: %s cannot be read (%s): workers take only what is written from now on",
                       path, error)  # fmt: skip

    def made(self, rule: Rule) -> None:
        """`rule` is in force (the first one made stands: an identical suspension is `already`)."""
        held = self.standing.in_force.get(rule.id)
        if held is None or held.kind != rule.kind:
            self.standing.in_force[rule.id] = rule
        self.standing.ended.pop(rule.id, None)

    def taken(self, rule: Rule) -> None:
        """`rule` as a worker holds it (its own clock's expiry; an earlier one `already` in force),
        unless it was ended meanwhile."""
        if rule.id in self.standing.in_force:
            self.standing.in_force[rule.id] = rule

    def forget(self, rule: Rule) -> None:
        """`rule`, kept as made, was taken by no worker (each refused it): it is not in force."""
        if self.standing.in_force.get(rule.id) is rule:
            del self.standing.in_force[rule.id]

    def end(self, rule_id: str, kind: str) -> None:
        held = self.standing.in_force.get(rule_id)
        if held is not None and held.kind == kind:
            del self.standing.in_force[rule_id]
        self.standing.ended.pop(rule_id, None)  # the latest last: the oldest go first
        self.standing.ended[rule_id] = Tombstone(kind, held.expires if held is not None else None)

    def save(self, now: float) -> None:
        """Write the file, without what has ended by itself meanwhile, durably (file, then its
        directory entry): after a power loss, an old or empty file would give a worker that
        missed a resume the suspension back, and lose every end recorded. Admin writes are
        rare: the fsync costs nothing that matters."""
        standing = self.standing
        standing.in_force = {i: r for i, r in standing.in_force.items() if r.live(now)}
        ended = [(i, t) for i, t in standing.ended.items() if t.until is None or t.until > now]
        standing.ended = dict(ended[-_KEEP_ENDED:])
        temporary = self._path.with_name(self._path.name + ".tmp")
        try:
            with temporary.open("wb") as file:
                file.write(encode(standing))
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self._path)
            fsync_directory(self._path.parent)
        except OSError as error:
            _log.warning("admin rules: cannot keep the node's standing rules in %s: %s", self._path, error)


Adopt = Callable[[list[Rule], dict[str, str]], Awaitable[tuple[list[Rule], list[Rule]]]]


async def take(standing: Standing, adopt: Adopt, now: float, worker: int, where: str) -> tuple[int, int]:
    """Take the node's standing rules (`Admin.adopt`), saying which this worker lacked: (added, ended)."""
    added, gone = await adopt(*standing.for_adopt(now))
    for rule in added:
        _log.warning(
            "admin rules: worker %d lacked %s %s of %s (by %s%s): taken from %s",
            worker,
            "suspension" if rule.kind == "suspend" else "standing bounce",
            rule.id,
            rule.selector.describe(),
            rule.operator,
            f": {rule.reason}" if rule.reason else "",
            where,
        )
    for rule in gone:
        _log.warning("admin rules: worker %d still held %s %s, ended meanwhile: ended here too (from %s)",
                     worker, rule.kind, rule.id, where)  # fmt: skip
    return len(added), len(gone)


async def take_node_rules(spool: Path, adopt: Adopt, now: float, worker: int) -> None:
    """At a worker's start, before it delivers: the rules its supervisor kept (see the module)."""
    path = node_rules_path(spool)
    try:
        standing = decode(path.read_bytes())
    except FileNotFoundError:
        return
    except (OSError, msgspec.DecodeError) as error:
        _log.error("admin rules: %s cannot be read (%s): starting with the rules this worker's spool kept",
                   path, error)  # fmt: skip
        return
    await take(standing, adopt, now, worker, "the node's rules, as its supervisor kept them")
