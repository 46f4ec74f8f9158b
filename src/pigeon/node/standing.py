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

In a cluster the file also learns what the other nodes made and ended (`pigeon.node.following`):
a rule ended elsewhere must not come back from it when a worker starts after Redis lost its data.

A worker that was merely slow, and applied the write late, holds the same rule under the same
id: taking it again changes nothing.

The rules are the node's whatever its worker count, and so is the file:

- a node of one worker has no supervisor: its worker takes the file at its start, as a worker
  of several does, and keeps it from then on with every rule it stores or drops, whatever made
  the change (`keep_node_rules`). So a node started again with more workers hands every worker
  the rules made while it had one, and a node started again with fewer does not bring back, from
  a shard it adopts, a rule that shard's worker missed the end of;
- a supervisor that starts, before it starts any worker, takes into the file every rule in
  force that a spool shard holds and the file knows nothing of, neither in force nor ended
  (`NodeRules.gather`): those a node of one worker made before it kept the file.

A hand-over and a later write reach a worker on separate connections, in either order. So the
supervisor counts its changes (`Standing.generation`), stamps each write it passes on with its
number (`GENERATION_HEADER`), and keeps with each rule and tombstone the number of the write that
made or ended it (`Standing.changed`): a worker takes nothing from a hand-over about a rule that
a newer write has reached it for (`Admin.adopt`). A resume or the end of a standing bounce that
overtook a hand-over is not undone by it, nor a suspension made again by a stale tombstone.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Final, NamedTuple

import msgspec

from pigeon.fsync import fsync_directory
from pigeon.queue.rules import Rule, Rules, decode_rule, describe_rule
from pigeon.spool.shards import existing_shards, shard_directory
from pigeon.spool.sqlite import stored_rules

_log = logging.getLogger(__name__)

RULES_FILE: Final = "admin-rules.json"
INTERNAL_PATH: Final = "/internal/rules"
"""Where a worker takes its node's rules (its control socket only: no token is asked there)."""
GENERATION_HEADER: Final = "Pigeon-Rules-Generation"
"""On a rule write the supervisor passes on: the number of that change (a worker heeds it on its
control socket only; the supervisor forwards no such header from a client)."""
_KEEP_ENDED: Final = 10_000  # tombstones kept at most: the latest


class Tombstone(msgspec.Struct):
    """A rule ended (cancelled, resumed): `kind`, and when it would have ended by itself (None:
    never; the tombstone may go after that)."""

    kind: str
    until: float | None = None


class Ended(NamedTuple):
    """A rule as it was before a write ended it (`NodeRules.end`, `NodeRules.restore`)."""

    rule_id: str
    rule: Rule | None
    tombstone: Tombstone | None


class Standing(msgspec.Struct):
    """The node's standing rules: those in force (id -> rule) and those ended (id -> tombstone);
    `generation`: how many changes the supervisor had counted when these were so; `changed`:
    id -> the number of the write that made or ended it (see the module)."""

    in_force: dict[str, Rule] = msgspec.field(default_factory=dict)
    ended: dict[str, Tombstone] = msgspec.field(default_factory=dict)
    generation: int = 0
    changed: dict[str, int] = msgspec.field(default_factory=dict)

    def for_adopt(self, now: float) -> tuple[list[Rule], dict[str, str], dict[str, int]]:
        """What `Admin.adopt` takes: the live rules, the ids ended (id -> kind), and the number
        of the write behind each."""
        live = [rule for rule in self.in_force.values() if rule.live(now)]
        return live, {rule_id: tomb.kind for rule_id, tomb in self.ended.items()}, self.changed


_DECODER: Final = msgspec.json.Decoder(Standing)


def node_rules_path(spool: Path) -> Path:
    return spool / RULES_FILE


def decode(blob: bytes) -> Standing:
    return _DECODER.decode(blob)


def encode(standing: Standing) -> bytes:
    return msgspec.json.encode(standing)


class NodeRules:
    """What the writes through this supervisor made and ended, kept in `path`.

    A rule a write makes is kept only once a worker has taken it (`taken`): a worker that
    starts, or is handed the rules, while the write is on its way does not take one that every
    worker then refuses, and whose answer is an error. An end is kept before the workers are
    asked (`end`): a worker that starts meanwhile does not take the rule being ended."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self.standing = Standing()
        self.found = True
        """Whether `path` was there: a Pigeon before 2026-12-04 kept no such file."""
        try:
            self.standing = decode(path.read_bytes())
        except FileNotFoundError:
            self.found = False  # none made through here yet, or kept by an older Pigeon
        except (OSError, msgspec.DecodeError) as error:
            _log.error("admin rules: %s cannot be read (%s): workers take only what is written from now on",
                       path, error)  # fmt: skip

    def next_generation(self) -> int:
        """The number of the next change (see the module)."""
        self.standing.generation += 1
        return self.standing.generation

    def taken(self, rule: Rule, generation: int) -> None:
        """`rule` as a worker took it from the write numbered `generation` (its own clock's
        expiry; for a suspension `already` in force, the one in force), unless a later write
        ended it meanwhile."""
        standing = self.standing
        if standing.changed.get(rule.id, 0) > generation:
            return
        standing.in_force[rule.id] = rule
        standing.ended.pop(rule.id, None)
        standing.changed[rule.id] = generation
        self.next_generation()  # what a hand-over from now on carries, and one before did not

    def end(self, rule_id: str, kind: str, generation: int) -> Ended:
        """The write numbered `generation` ends `rule_id`: what it was before, for `restore`."""
        standing = self.standing
        before = Ended(rule_id, standing.in_force.get(rule_id), standing.ended.get(rule_id))
        held = before.rule
        if held is not None and held.kind == kind:
            del standing.in_force[rule_id]
        standing.ended.pop(rule_id, None)  # the latest last: the oldest go first
        standing.ended[rule_id] = Tombstone(kind, held.expires if held is not None else None)
        standing.changed[rule_id] = generation
        return before

    def restore(self, before: Ended, generation: int) -> None:
        """The end numbered `generation`, which no worker carried out (each refused it, or
        failed): the rule as it was, unless a later write changed it. A new change: what a
        hand-over carries from now on."""
        standing = self.standing
        rule_id = before.rule_id
        if standing.changed.get(rule_id, 0) > generation:
            return  # made or ended again since
        standing.ended.pop(rule_id, None)
        if before.tombstone is not None:
            standing.ended[rule_id] = before.tombstone
        if before.rule is not None:
            standing.in_force[rule_id] = before.rule
        standing.changed[rule_id] = self.next_generation()

    def kept(self, rule: Rule, in_force: bool) -> None:
        """The worker of a node of one worker stored `rule` (True) or dropped it (False): so do
        the node's rules, a change numbered as a supervisor numbers its writes."""
        standing = self.standing
        standing.ended.pop(rule.id, None)  # the latest last: the oldest go first
        if in_force:
            standing.in_force[rule.id] = rule
        else:
            standing.in_force.pop(rule.id, None)
            standing.ended[rule.id] = Tombstone(rule.kind, rule.expires)
        standing.changed[rule.id] = self.next_generation()

    def gather(self, held: Iterable[tuple[int, Rule]], now: float) -> list[tuple[int, Rule]]:
        """Of the rules the spool shards hold ((shard, rule)), take in force each live one these
        rules know nothing of, neither in force nor ended (see the module): one ended here is
        one a worker missed the end of, and stays ended. What was taken."""
        standing = self.standing
        taken: list[tuple[int, Rule]] = []
        for shard, rule in held:
            if not rule.live(now) or _holds(standing, rule.id, now) or rule.id in standing.ended:
                continue
            standing.in_force[rule.id] = rule
            standing.changed[rule.id] = self.next_generation()
            taken.append((shard, rule))
        return taken

    def learn(
        self, in_force: list[Rule], ended: dict[str, tuple[Tombstone, float | None]], as_of: int, now: float
    ) -> bool:
        """What the cluster made (`in_force`) and ended (id -> tombstone, and when it was ended if
        known), as this node's workers take it from Redis and the stream, learnt while the node's
        rules were numbered `as_of` (`pigeon.node.following`): a rule a write through here has
        changed since is left as that write left it, and an end older than the rule held (made
        again since) does not end it. Matched by id. Whether anything changed."""
        standing = self.standing
        learnt = False
        for rule in in_force:
            if standing.changed.get(rule.id, 0) > as_of or _holds(standing, rule.id, now) or not rule.live(now):
                continue
            standing.in_force[rule.id] = rule
            standing.ended.pop(rule.id, None)
            standing.changed[rule.id] = as_of
            learnt = True
        for rule_id, (tombstone, when) in ended.items():
            if standing.changed.get(rule_id, 0) > as_of:
                continue
            held = standing.in_force.get(rule_id)
            if held is None and rule_id in standing.ended:
                continue  # ended here already
            if held is not None and (held.kind != tombstone.kind or (when is not None and held.created > when)):
                continue  # another rule, or this one made again after that end
            if held is not None:
                del standing.in_force[rule_id]
                tombstone = Tombstone(tombstone.kind, tombstone.until if tombstone.until is not None else held.expires)
            standing.ended[rule_id] = tombstone
            standing.changed[rule_id] = as_of
            learnt = True
        return learnt

    def run_out(self, now: float) -> list[Rule]:
        """Drop the rules in force that have run out by `now`, and say so: the node's log has
        each rule's making, and its end by a resume or a cancel; this is its end by itself,
        said once (here, in the node's rules: not by each worker that held it)."""
        standing = self.standing
        gone = [rule for rule in standing.in_force.values() if not rule.live(now)]
        for rule in gone:
            del standing.in_force[rule.id]
            assert rule.expires is not None  # (only a rule with a duration runs out)
            when = datetime.datetime.fromtimestamp(rule.expires, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            _log.warning("admin rules: %s by %s%s ran out at %s", describe_rule(rule), rule.operator,
                         f" ({rule.reason})" if rule.reason else "", when)  # fmt: skip
        return gone

    def save(self, now: float) -> OSError | None:
        """Write the file, without what has ended by itself meanwhile, durably (file, then its
        directory entry): after a power loss, an old or empty file would give a worker that
        missed a resume the suspension back, and lose every end recorded. Admin writes are
        rare: the fsync costs nothing that matters. The error, if it could not be written."""
        standing = self.standing
        self.run_out(now)
        ended = [(i, t) for i, t in standing.ended.items() if t.until is None or t.until > now]
        standing.ended = dict(ended[-_KEEP_ENDED:])
        standing.changed = {i: g for i, g in standing.changed.items() if i in standing.in_force or i in standing.ended}
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
            return error
        return None


async def say_run_out(rules: NodeRules, clock: Callable[[], float], every: float = 1.0) -> None:
    """Runs until cancelled: within `every` seconds of a standing rule's end by itself, it is
    said (`NodeRules.run_out`) and the file kept without it."""
    while True:
        await asyncio.sleep(every)
        now = clock()
        if any(not rule.live(now) for rule in rules.standing.in_force.values()):
            rules.save(now)


def _holds(standing: Standing, rule_id: str, now: float) -> bool:
    """Whether a live rule holds `rule_id` in `standing`: one that has run out (until the next
    `save` drops it) frees its id for a new rule."""
    held = standing.in_force.get(rule_id)
    return held is not None and held.live(now)


# adopt(rules in force, ended: id -> kind, id -> number of the write behind it) -> (added, ended)
Adopt = Callable[[list[Rule], dict[str, str], dict[str, int]], Awaitable[tuple[list[Rule], list[Rule]]]]


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


def shard_rules(root: Path) -> list[tuple[int, Rule]]:
    """Every rule the spool shards under `root` keep, as (shard, rule): read while no worker has
    them open (a supervisor before it starts its workers). A shard that cannot be read is said and
    passed over: its worker, once started, says the rest."""
    found: list[tuple[int, Rule]] = []
    for shard in existing_shards(root):
        directory = shard_directory(root, shard)
        try:
            rows = stored_rules(directory)
        except sqlite3.Error as error:
            _log.error("admin rules: the rules spool %s kept cannot be read (%s)", directory, error)
            continue
        for rule_id, blob in rows:
            try:
                found.append((shard, decode_rule(blob)))
            except msgspec.DecodeError:
                _log.error("admin rule %s in %s cannot be read: ignored", rule_id, directory)
    return found


def gather_shard_rules(rules: NodeRules, root: Path, now: float) -> None:
    """At a supervisor's start, before any worker: the rules in force that the shards under `root`
    hold and the node's rules lack, taken into them (`NodeRules.gather`), and kept."""
    held = shard_rules(root)
    shards: dict[str, list[int]] = {}
    for shard, rule in held:
        shards.setdefault(rule.id, []).append(shard)
    taken = rules.gather(held, now)
    for _, rule in taken:
        kind = "suspension" if rule.kind == "suspend" else "standing bounce"
        named = f"{kind} {rule.id} of {rule.selector.describe()} (by {rule.operator})"
        holders = shards[rule.id]
        where = f"shard {holders[0]} only" if len(holders) == 1 else "shards " + ", ".join(map(str, holders))
        if not rules.found:  # an upgrade: the node's rules file is newer than the rule
            _log.info("admin rules: %s, kept by %s (a Pigeon before this one kept no %s): every worker takes it",
                      named, where, RULES_FILE)  # fmt: skip
        else:
            _log.warning("admin rules: %s was kept by %s, not in the node's rules (made while the node ran with "
                         "one worker?): every worker takes it", named, where)  # fmt: skip
    if taken:
        rules.save(now)


async def keep_node_rules(spool: Path, adopt: Adopt, rules: Rules, clock: Callable[[], float]) -> NodeRules:
    """A node of one worker, at its start, before it delivers (see the module): the worker takes
    the node's rules from the file (those in force it lacks, the ends it missed), the file takes
    what the worker holds, and from then on every rule it stores or drops (`Rules.kept`)."""
    node_rules = NodeRules(node_rules_path(spool))
    now = clock()
    generation = node_rules.standing.generation
    await take(node_rules.standing, adopt, now, 0, "the node's rules, as its last run kept them")
    for rule in rules:
        if rule.live(now) and node_rules.standing.in_force.get(rule.id) != rule:
            node_rules.kept(rule, True)
    if node_rules.standing.generation != generation:  # a rule this worker holds that the file lacked
        node_rules.save(now)

    def kept(rule: Rule, in_force: bool) -> None:
        node_rules.kept(rule, in_force)
        node_rules.save(clock())

    rules.kept = kept
    return node_rules
