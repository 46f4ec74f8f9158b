"""One node per spool and per port: a second `pigeon serve` stops at once, saying why, and the
first keeps every connection (no SO_REUSEPORT sharing the port behind its back)."""

from __future__ import annotations

import smtplib
from pathlib import Path

from tests.support.process import PigeonProcess

MESSAGE = b"Subject: hi\r\n\r\nhello\r\n"


def test_a_second_node_on_the_same_spool_exits_1_naming_the_node_lock(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "first", node={"workers": 2}, spool={"path": str(tmp_path / "spool")}) as first:
        assert first.process is not None
        second = PigeonProcess(tmp_path / "second", spool={"path": str(tmp_path / "spool")})
        second.start(wait=False)
        assert second.wait_exit() == 1
        lock = tmp_path / "spool" / "node.lock"
        assert f"pigeon: cannot start: another node holds {lock} (pid {first.process.pid})" in second.stderr()
        assert "worker" not in second.stderr()  # stopped before it started any
        with smtplib.SMTP("127.0.0.1", first.smtp_port, timeout=10) as client:
            assert client.sendmail("a@src.test", ["b@dst.test"], MESSAGE) == {}
        assert len(first.spool_messages()) == 1


def test_a_second_node_on_the_same_smtp_port_exits_1_and_the_first_keeps_every_connection(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "first", node={"workers": 2}) as first:
        second = PigeonProcess(tmp_path / "second", smtp={"listen": [f"127.0.0.1:{first.smtp_port}"]})
        second.start(wait=False)
        assert second.wait_exit() == 1
        expected = f"pigeon: cannot start: [smtp] listen 127.0.0.1:{first.smtp_port}: cannot listen: the port is in use"
        assert expected in second.stderr()
        for _ in range(10):
            with smtplib.SMTP("127.0.0.1", first.smtp_port, timeout=10) as client:
                assert client.sendmail("a@src.test", ["b@dst.test"], MESSAGE) == {}
        assert len(first.spool_messages()) == 10
        assert not (second.root / "spool").exists() or not list((second.root / "spool").glob("shard-*"))


def test_a_second_node_on_the_same_http_port_exits_1_naming_the_setting(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "first") as first:
        second = PigeonProcess(tmp_path / "second", http={"listen": f"127.0.0.1:{first.http_port}"})
        second.start(wait=False)
        assert second.wait_exit() == 1
        expected = f"pigeon: cannot start: [http] listen 127.0.0.1:{first.http_port}: cannot listen: the port is in use"
        assert expected in second.stderr()
        assert first.http_get("/healthz")[0] == 200


def test_the_node_lock_is_released_when_the_node_stops(tmp_path: Path) -> None:
    node = PigeonProcess(tmp_path / "node", node={"workers": 2})
    with node:
        pass
    with node:  # the same spool and ports again: nothing of the first run holds them
        assert node.http_get("/healthz")[0] == 200
