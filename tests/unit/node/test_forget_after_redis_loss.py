"""A node the cluster forgot (`pigeon cluster forget`) stays forgotten when Redis loses its data
right after, though the other nodes give the presence hash back as they last saw it
(`Broadcast._give_presence_back`), against a real Redis restarted empty: every worker 0 here last
looked before the forget, and gives back after the loss, in either order."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from pigeon.config.load import load
from pigeon.config.schema import Config
from pigeon.node import presence
from pigeon.node.broadcast import Broadcast
from tests.support.services import RedisServer

NODES = "pigeon:admin:nodes"


def _config(tmp_path: Path, redis_server: RedisServer, name: str) -> Config:
    spool = tmp_path / name / "spool"
    spool.mkdir(parents=True, exist_ok=True)
    config = tmp_path / name / "pigeon.toml"
    config.write_text(
        f'[node]\nname = "{name}"\n[spool]\npath = "{spool}"\n[redis]\nurl = "{redis_server.url}"\ntimeout = "1s"\n'
    )
    return load(config)


def _listed(redis_server: RedisServer) -> list[tuple[str, bool]]:
    """What `pigeon cluster nodes` lists: each node known, and whether it runs."""
    client = redis_server.client()
    try:
        return [(row["node"], row["running"]) for row in presence.known_nodes(client.hgetall(NODES), time.time())]
    finally:
        client.close()


@pytest.mark.parametrize("asked", ["worker 0", "worker 1"])
@pytest.mark.parametrize("first_back", ["ca", "cc"])
async def test_a_node_forgotten_just_before_redis_lost_its_data_is_not_given_back_by_the_others(
    tmp_path: Path, redis_server: RedisServer, asked: str, first_back: str
) -> None:
    # An outside tester, nodes ca, cb, cc: cb stopped, `pigeon cluster forget cb` on ca, Redis
    # restarted empty within a second: 10 s later `pigeon cluster nodes` listed cb again, and
    # every write named it pending for a day: ca's and cc's worker 0 had last seen the presence
    # hash before the forget, and gave cb's entry back with the rest.
    on_ca = _config(tmp_path, redis_server, "ca")
    ca = Broadcast(on_ca, worker=0, workers=2)
    ca_other = Broadcast(on_ca, worker=1, workers=2)
    cc = Broadcast(_config(tmp_path, redis_server, "cc"), worker=0, workers=1)
    cb = Broadcast(_config(tmp_path, redis_server, "cb"))
    cd = Broadcast(_config(tmp_path, redis_server, "cd"))  # stopped too, and not forgotten
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        for stopping in (cb, cd):
            await stopping._renew()
            await stopping.leave()  # a graceful stop: known, not running, named pending
        for worker in (ca, ca_other, cc):
            await worker._renew()  # each worker 0 keeps the hash as it is now: cb in it
        assert _listed(redis_server) == [("ca", True), ("cb", False), ("cc", True), ("cd", False)]

        rows, _ = await presence.forget(client, on_ca, "cb")  # what `DELETE .../cluster/nodes/cb` on ca does
        assert [row["node"] for row in rows] == ["cb"]
        (ca if asked == "worker 0" else ca_other).forgot({row["entry"]: row["last_seen"] for row in rows})
        assert _listed(redis_server) == [("ca", True), ("cc", True), ("cd", False)]

        redis_server.kill()  # kill -9, no persistence: the presence hash is gone, the forget too
        redis_server.start()
        # The next renewal of every worker, before any of them looked at the hash since the forget.
        order = [ca, ca_other, cc] if first_back == "ca" else [cc, ca, ca_other]
        for worker in order:
            await worker._renew()
        # cd, stopped but not forgotten, is known again (the writes name it pending); cb is not.
        assert _listed(redis_server) == [("ca", True), ("cc", True), ("cd", False)]
        for worker in order:
            await worker._renew()  # and it stays so: the next look gives nothing back
        assert _listed(redis_server) == [("ca", True), ("cc", True), ("cd", False)]
    finally:
        await client.aclose()
        for each in (ca, ca_other, cc, cb, cd):
            await each.close()
