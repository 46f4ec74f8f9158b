"""The spool is private to the node's user (mode 0700), as the README says: it holds the mail,
the API token and the workers' control sockets. An outside tester found it 0755 on a node
started as root without `[node] user`, beside a log directory, shards and `run` of 0700."""

from __future__ import annotations

import stat
from pathlib import Path

from tests.support.process import PigeonProcess


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_spool_a_node_makes_is_private_like_the_rest_of_its_directories(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", node={"workers": 2}) as pigeon:
        spool = pigeon.spool_path
        made = [spool, tmp_path / "node" / "log", spool / "run", *spool.glob("shard-*")]
        assert len(made) >= 4
        assert {str(path): _mode(path) for path in made} == {str(path): 0o700 for path in made}
        assert "let other users in" not in pigeon.stderr()


def test_a_spool_left_open_to_other_users_is_made_private_and_said(tmp_path: Path) -> None:
    spool = tmp_path / "node" / "spool"
    spool.mkdir(parents=True)
    spool.chmod(0o755)  # as an earlier Pigeon made it
    with PigeonProcess(tmp_path / "node") as pigeon:
        assert _mode(spool) == 0o700
        assert "spool: mode 0755 let other users in; made it 0700 (the spool is private)" in pigeon.stderr()
