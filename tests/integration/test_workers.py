"""Several worker processes share the SMTP port, each with its own spool shard, under one supervisor."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import sqlite3
import time
from contextlib import closing
from pathlib import Path

from tests.support.attacks import worker_pids
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config
from tests.support.tools import smtp_source


def _health(pigeon: PigeonProcess) -> dict[str, object]:
    status, body = pigeon.http_get("/healthz")
    health: dict[str, object] = json.loads(body)
    health["http_status"] = status
    return health


def test_two_workers_share_the_load_and_report_merged_metrics(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", node={"workers": 2}) as pigeon:
        health = _health(pigeon)
        assert health["http_status"] == 200
        assert [w["worker"] for w in health["workers"]] == [0, 1]  # type: ignore[attr-defined]
        result = smtp_source(
            pigeon.smtp_port, "-s", "20", "-l", "2000", "-m", "300", "-f", "a@src.test", "-t", "r@x.test"
        )
        assert result.returncode == 0, result.stderr
        stored = pigeon.spool_messages()
        assert len(stored) == 300
        per_shard = {}
        for db in (pigeon.root / "spool").glob("shard-*/spool.db"):
            with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
                per_shard[db.parent.name] = conn.execute("SELECT count(*) FROM message").fetchone()[0]
        assert set(per_shard) == {"shard-0", "shard-1"}
        assert all(n > 0 for n in per_shard.values()), per_shard  # both workers took connections
        assert sum(per_shard.values()) == 300
        assert pigeon.metric("pigeon_messages_received_total") == 300
        assert pigeon.metric("pigeon_spool_messages") == 300
        assert len(pigeon.wait_records("Reception", 300)) == 300
        logs = sorted(p.name.rsplit("-", 1)[1] for p in (pigeon.root / "log").iterdir())
        assert {"w0.jsonl", "w1.jsonl"} <= set(logs)


def test_a_killed_worker_is_restarted_and_its_mail_is_kept(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", node={"workers": 2}) as pigeon:
        smtp_source(pigeon.smtp_port, "-s", "10", "-l", "1000", "-m", "100", "-f", "a@src.test", "-t", "r@x.test")
        pids = pigeon.shard_owners()
        os.kill(pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            health = _health(pigeon)
            workers = health["workers"]
            if health["http_status"] == 200 and workers[1]["restarts"] == 1:  # type: ignore[index]
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"worker 1 was not restarted: {health}")
        assert len(pigeon.spool_messages()) == 100
        assert pigeon.metric("pigeon_spool_messages") == 100


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_workers_stop_when_their_supervisor_is_killed_and_a_restart_delivers_the_queue(tmp_path: Path) -> None:
    root = tmp_path / "node"
    with PigeonProcess(root, node={"workers": 2}) as pigeon:
        assert pigeon.process is not None
        smtp_source(pigeon.smtp_port, "-s", "4", "-l", "1000", "-m", "20", "-f", "a@src.test", "-t", "r@x.test")
        workers = worker_pids(pigeon)
        assert len(workers) == 2
        os.kill(pigeon.process.pid, signal.SIGKILL)  # the supervisor alone, not its group
        pigeon.process.wait(5)
        deadline = time.monotonic() + 5
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in workers if _alive(pid)], "workers outlived their supervisor"
    with ScriptedSink() as sink, PigeonProcess(root, node={"workers": 2}, **delivery_config(sink.endpoint)):
        assert len(sink.wait_for(20)) == 20


def test_fewer_workers_adopt_the_shards_of_a_larger_run(tmp_path: Path) -> None:
    root = tmp_path / "node"
    with PigeonProcess(root, node={"workers": 2}) as pigeon:
        smtp_source(pigeon.smtp_port, "-s", "10", "-l", "1000", "-m", "60", "-f", "a@src.test", "-t", "r@x.test")
    with PigeonProcess(root, node={"workers": 1}) as pigeon:
        assert pigeon.metric("pigeon_spool_messages") == 60
        pigeon.wait_stderr("shard-1: ")  # its check, after the start


def test_with_one_connection_allowed_an_idle_connection_makes_room_for_the_other_workers_mail(tmp_path: Path) -> None:
    """`connection_limit = 1` on a 2-worker node: a worker whose queue is empty gives the slot
    back within a second, instead of keeping it idle for the whole `idle_timeout` while the
    other worker's mail waits for it."""
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint, idle_timeout="10s", connection_limit=1)
        with PigeonProcess(tmp_path / "node", node={"workers": 2}, **config) as pigeon:
            started = time.monotonic()
            for n in range(12):  # the supervisor hands requests to each worker in turn
                status, answer = pigeon.http_post(
                    "/api/v1/inject",
                    {
                        "envelope_sender": "a@example.org",
                        "content": f"From: a@example.org\r\nSubject: {n}\r\n\r\nhello\r\n",
                        "recipients": [{"email": f"user{n}@example.net"}],
                    },
                    pigeon.local_token,
                )
                assert status == 200, answer
            sink.wait_for(12, timeout=30)
            took = time.monotonic() - started
    assert len(sink.received) == 12
    assert took < 6, f"12 messages took {took:.1f}s: a slot was kept idle for idle_timeout (10 s)"
    opened = sorted(sink.connections, key=lambda c: c.opened)
    assert all(a.ended is not None and a.ended <= b.opened + 0.05 for a, b in itertools.pairwise(opened))


def test_workers_do_not_import_files_from_the_directory_pigeon_runs_in(tmp_path: Path) -> None:
    """A file in the working directory named like a module Pigeon imports (dns.py, struct.py)
    must not stand in for it in a worker (the supervisor starts them with `python -m`, which
    would put that directory first on their import path)."""
    root = tmp_path / "node"
    with PigeonProcess(root, node={"workers": 2}) as pigeon:
        for shadow in ("dns.py", "struct.py", "msgspec.py"):
            (root / shadow).write_text("raise SystemExit('imported from the working directory')\n")
        pids = pigeon.shard_owners()
        os.kill(pids[1], signal.SIGKILL)  # its replacement starts with those files there
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            health = _health(pigeon)
            if health["http_status"] == 200 and health["workers"][1]["restarts"] == 1:  # type: ignore[index]
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"worker 1 was not restarted: {health}")
        assert "imported from the working directory" not in pigeon.stderr()


def _policies(pids: list[int]) -> set[int]:
    """The scheduling policy of every thread of these processes (a short-lived one, gone
    between its listing and the question, says nothing)."""
    found = set()
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(ProcessLookupError):
                found.add(os.sched_getscheduler(int(task.name)))
    return found


def test_every_thread_of_every_worker_runs_as_a_batch_job_unless_told_otherwise(tmp_path: Path) -> None:
    """SCHED_BATCH by default (wakeups do not preempt: bigger loop turns and commits under
    load), for the supervisor, both workers and their threads (the spool's commit thread was
    started after the policy was set); `scheduling = "normal"` leaves the system's default."""
    with PigeonProcess(tmp_path / "two", node={"workers": 2}) as pigeon:
        assert pigeon.process is not None
        workers = worker_pids(pigeon)
        assert len(workers) == 2
        result = smtp_source(pigeon.smtp_port, "-s", "2", "-m", "4", "-f", "a@src.test", "-t", "r@x.test")
        assert result.returncode == 0, result.stderr
        assert all(len(list(Path(f"/proc/{pid}/task").glob("*"))) > 1 for pid in workers)  # threads too
        assert _policies([pigeon.process.pid, *workers]) == {os.SCHED_BATCH}
    with PigeonProcess(tmp_path / "one", node={"workers": 1, "scheduling": "normal"}) as pigeon:
        assert pigeon.process is not None
        assert _policies([pigeon.process.pid]) == {os.SCHED_OTHER}
