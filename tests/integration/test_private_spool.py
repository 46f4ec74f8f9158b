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


def test_every_file_a_node_writes_in_its_spool_and_log_is_private(tmp_path: Path) -> None:
    """README: files Pigeon writes are private to its user (umask 077). `http-address` was
    written before the umask was set, 0644."""
    http = {"token": [{"name": "app", "token": "private-token-0123456789", "scopes": ["inject"]}]}
    with PigeonProcess(tmp_path / "node", node={"workers": 2}, http=http) as pigeon:
        request = {"envelope_sender": "a@example.org", "recipients": [{"email": "b@example.net"}]}
        request["content"] = "From: a@example.org\r\nSubject: hi\r\n\r\nhello\r\n"
        status, answer = pigeon.http_post("/api/v1/inject", request, "private-token-0123456789")
        assert status == 200, answer
        pigeon.wait_records("Reception")
        files = [
            path
            for directory in (pigeon.spool_path, tmp_path / "node" / "log")
            for path in directory.rglob("*")
            if path.is_file() and not path.is_symlink()
        ]
        assert pigeon.spool_path / "http-address" in files
        assert {str(path): oct(_mode(path)) for path in files if _mode(path) & 0o077} == {}
