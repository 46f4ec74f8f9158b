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
from typing import Any, Final

from pigeon.config.schema import Config
from pigeon.redaction import redact, redact_url

_log = logging.getLogger(__name__)

PRESENCE: Final = 10.0  # seconds a node counts as present after its last renewal
REMEMBERED: Final = 86_400.0
"""Seconds a node that stopped (or was killed) stays known to the cluster after it was last
there: a write issued meanwhile names it `pending` (it applies the write when it starts again,
reading the admin stream on from where it stopped). Past that it is forgotten, its entry removed:
a node taken out of the cluster is not named for ever. `pigeon cluster forget NODE` removes one
sooner (`forget`): a node decommissioned is not named `pending` by every write for a day."""
_LOOK_EVERY: Final = 0.5  # seconds between two looks at the presence hash while waiting


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
    graceful stop), else its last renewal (its entry lasts `PRESENCE` from then)."""
    left = entry.get("left")
    return float(left) if left is not None else float(entry["expires"]) - PRESENCE


def presence_key(config: Config) -> str:
    return f"{config.redis.key_prefix}:admin:nodes"


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
