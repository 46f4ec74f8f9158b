"""One live node per `[node] name` in a cluster: a second node under a live node's name is refused.

The name is what the cluster counts nodes by: the admin broadcast waits for one answer per
worker of each name present (`pigeon.node.broadcast`), and the shared throttles count the
nodes that share a limit by the names in their heartbeat (`pigeon.shaping.cluster`). Two
live nodes of one name are one node to both: a cluster read or bulk bounce takes whichever
of the two answers first and leaves out the other's mail, and in a Redis outage each takes
the share of a node fewer than there are. So `pigeon serve` looks before it starts (`check_name`).

Who is who. Every worker renews its node's entry in the presence hash (`<prefix>:admin:nodes`)
every 2 s, valid for `PRESENCE` (10 s), and the entry carries the node's spool identity: a
random id made once in the spool (`<spool>/node.id`). One spool serves one node (the node
lock, taken before this look), so an entry of our name and our spool identity is this node's
own, left by a run killed (kill -9) before it could say it was leaving: it is no obstacle.
An entry of our name and another spool identity (or none: a Pigeon of an earlier version) is
another node's, perhaps dead as well: it is live if it is renewed while we watch, and dead if
it runs out first. So a start waits (at most `PRESENCE`) only while such an entry is there.

What it cannot see: two nodes of one name that start within one renewal of each other, or
while Redis is away, each find nothing and start. Each worker 0 then looks at every renewal
(`Namesakes`) and logs an error every minute while another node of its name is live.
Redis away at start never stops a node from starting: it is said in the log, and the look is
left to the renewals. A spool copied with its `node.id` (a cloned machine) passes for the same
node: give the copy a new one by deleting the file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pigeon.config.schema import Config
from pigeon.redaction import redact, redact_url

if TYPE_CHECKING:
    import redis.asyncio as aioredis

_log = logging.getLogger(__name__)

PRESENCE: Final = 10.0  # seconds a node counts as present after its last renewal
REMEMBERED: Final = 86_400.0
"""Seconds a node that stopped (or was killed) stays known to the cluster after it was last
there: a write issued meanwhile names it `pending` (it applies the write when it starts again,
reading the admin stream on from where it stopped). Past that it is forgotten, its entry removed:
a node taken out of the cluster is not named for ever. `pigeon cluster forget NODE` removes one
sooner (`forget`): a node decommissioned is not named `pending` by every write for a day."""
_LOOK_EVERY: Final = 0.5  # seconds between two looks at the presence hash while waiting
_TRIES: Final = 10  # the presence hash changed between a forget's look and its removal: looked at again


def spool_identity(spool: Path) -> str:
    """The id of the node that the spool `spool` serves, made the first time it is asked for."""
    path = spool / "node.id"
    with contextlib.suppress(FileNotFoundError):
        return path.read_text().strip()
    spool.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    temporary.write_text(secrets.token_hex(8) + "\n")
    try:
        os.link(temporary, path)  # the first of the node's processes to make one sets it
    except FileExistsError:
        pass
    finally:
        temporary.unlink(missing_ok=True)
    return path.read_text().strip()


def last_seen(entry: dict[str, Any]) -> float:
    """When a node's presence entry says it was last there: when it said it was leaving (a
    graceful stop), else its last renewal (its entry lasts `PRESENCE` from then; an entry given
    back after Redis lost its data, kept past that, says when it was: `renewed`)."""
    left = entry.get("left")
    if left is not None:
        return float(left)
    renewed = entry.get("renewed")
    return float(renewed) if renewed is not None else float(entry["expires"]) - PRESENCE


def presence_key(config: Config) -> str:
    return f"{config.redis.key_prefix}:admin:nodes"


def forgotten_key(config: Config) -> str:
    """The nodes forgotten (`forget`): presence hash field -> when its node was last there."""
    return f"{config.redis.key_prefix}:admin:nodes:forgotten"


def forgotten_entries(entries: dict[Any, Any], now: float) -> dict[bytes, float]:
    """What the forgotten nodes' hash `entries` (`HGETALL`) says: field -> when that node was
    last there, for those it still says something of (forgotten within `REMEMBERED` of it)."""
    forgotten: dict[bytes, float] = {}
    for field, value in entries.items():
        with contextlib.suppress(ValueError, TypeError):
            seen = float(value)
            if seen > now - REMEMBERED:
                forgotten[field.encode() if isinstance(field, str) else bytes(field)] = seen
    return forgotten


def is_forgotten(forgotten: dict[bytes, float], field: bytes, value: Any) -> bool:
    """Whether the presence entry `value` (at hash field `field`) is one the cluster forgot:
    last there no later than its node was when it was forgotten. Its node started again since
    renews a later one, which is not."""
    at = forgotten.get(field)
    if at is None:
        return False
    try:
        return last_seen(json.loads(value)) <= at
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


async def forget(
    client: aioredis.Redis, config: Config, name: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Forget the node `name` (`pigeon cluster forget`): its presence entries removed, and
    said forgotten in `forgotten_key`, in one transaction. The rows forgotten (none: no node of
    that name is known; a running one among them: none is removed, it would renew its entry) and
    every row known when it was looked at. Raises WatchError if the hash changed every time.

    Why said, and not only removed: each worker 0 keeps the presence hash as it last saw it, and
    gives the other nodes' entries back should Redis lose its data (`Broadcast._give_presence_back`).
    One that saw the hash before this forget would give the node back, named `pending` by every
    write for a day again; the forgotten entries are given back with the rest, and an entry they
    cover is not given back, and is removed where another worker gave it back."""
    from redis.exceptions import WatchError

    key, said = presence_key(config), forgotten_key(config)
    for _ in range(_TRIES):
        async with client.pipeline(transaction=True) as pipe:
            # Watched: a node that starts meanwhile writes its entry, and is then running.
            await pipe.watch(key)
            entries: dict[Any, Any] = await pipe.hgetall(key)
            known = known_nodes(entries, time.time())
            rows = [row for row in known if row["node"] == name]
            if not rows or any(row["running"] for row in rows):
                return rows, known
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.hdel(key, *(row["entry"] for row in rows))
            pipe.hset(said, mapping={row["entry"]: repr(row["last_seen"]) for row in rows})
            pipe.expire(said, int(REMEMBERED))
            try:
                await pipe.execute()
            except WatchError:
                continue
        return rows, known
    raise WatchError(f"the cluster's nodes changed {_TRIES} times meanwhile")


def known_nodes(entries: dict[Any, Any], now: float) -> list[dict[str, Any]]:
    """The nodes the presence hash `entries` (`HGETALL`) knows, a row each, by name: `running`
    (its entry renewed within `PRESENCE`), `last_seen` (its last renewal, for one running;
    else when it stopped, or was last there: `last_seen`), `left` (true: it said it was leaving, a graceful
    stop; false: its entry ran out, the node killed or cut off from Redis), `forgotten_at` (when
    the cluster forgets it by itself: a `REMEMBERED` after it was last there), its `workers`, its
    `spool` id and its `entry` (the hash's field). An entry that cannot be read is left out; a
    name twice (two spools) is two rows."""
    rows: list[dict[str, Any]] = []
    for field, value in entries.items():
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
            seen = json.loads(value)
            running = float(seen["expires"]) > now
            last = last_seen(seen)
            row: dict[str, Any] = {
                "node": str(seen["node"]),
                "running": running,
                "last_seen": last,
                "workers": int(seen.get("workers", 1)),
                "spool": seen.get("spool"),
                "entry": field.decode() if isinstance(field, bytes) else str(field),
            }
            if not running:
                row["left"] = seen.get("left") is not None
                row["forgotten_at"] = last + REMEMBERED
            rows.append(row)
    return sorted(rows, key=lambda row: (row["node"], not row["running"], -row["last_seen"]))


class Namesakes:
    """Other nodes of our name seen renewed between two looks at the presence hash."""

    def __init__(self, name: str, spool: str) -> None:
        self._name = name
        self._spool = spool
        self._seen: dict[tuple[bytes, str], float] = {}  # (hash field, spool id) -> expires

    @property
    def waiting(self) -> bool:
        """Whether an entry of another node of our name was present at the last look."""
        return bool(self._seen)

    def look(self, entries: dict[Any, Any], now: float) -> list[str]:
        """The hash as it is now: what says each of our namesakes renewed since the last look."""
        current: dict[tuple[bytes, str], float] = {}
        renewed: list[str] = []
        for field, value in entries.items():
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                seen = json.loads(value)
                if seen["node"] != self._name or seen.get("spool") == self._spool:
                    continue
                expires = float(seen["expires"])
                if expires <= now:
                    continue  # gone: a node that leaves, or dies, stops renewing
                key = (bytes(field), str(seen.get("spool")))
                current[key] = expires
                before = self._seen.get(key)
                if before is not None and expires > before:
                    spool = seen.get("spool", "(none: an earlier Pigeon)")
                    renewed.append(f"spool id {spool}, {int(seen.get('workers', 1))} worker(s)")
        self._seen = current
        return renewed


def check_name(config: Config, *, look_every: float = _LOOK_EVERY) -> str | None:
    """Before the node starts (its node lock held): why it must not, if another live node in
    the cluster has its name; None otherwise, also when Redis cannot be reached (said in the log)."""
    url = config.redis.url
    if url is None:
        return None
    # Imported here: a node without Redis need not spend a tenth of a second on its client.
    import redis
    from redis.exceptions import RedisError

    name = config.node.name
    watch = Namesakes(name, spool_identity(config.spool.path))
    timeout = float(config.redis.timeout)
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    key = presence_key(config)
    deadline = time.monotonic() + PRESENCE + 2 * look_every
    said = False
    try:
        while True:
            renewed = watch.look(client.hgetall(key), time.time())
            if renewed:
                return (
                    f'configuration error: [node] name "{name}" is taken by a node that runs now ({renewed[0]}), '
                    f"seen in Redis at {redact_url(url)}: the cluster counts its nodes by name, and would leave out "
                    "one of the two's mail; give this node another [node] name"
                )
            if not watch.waiting or time.monotonic() > deadline:
                return None
            if not said:
                said = True
                _log.info('another node named "%s" was present lately: waiting (up to %.0fs) to see if it still runs',
                          name, PRESENCE)  # fmt: skip
            time.sleep(look_every)
    except (RedisError, OSError) as error:
        _log.warning('Redis cannot be reached (%s): starting without checking that no other node runs as "%s"; '
                     "the check is made again once it answers", redact(str(error)), name)  # fmt: skip
        return None
    finally:
        with contextlib.suppress(RedisError, OSError):
            client.close()
