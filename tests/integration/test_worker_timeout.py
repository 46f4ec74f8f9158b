"""`[node] worker_timeout`: a worker that stops answering its supervisor (here: SIGSTOP) is
killed and started again while the other workers keep taking mail, and an admin request the
workers are all asked does not hang on it: 503 with what the others answered."""

from __future__ import annotations

import json
import os
import signal
import smtplib
import time
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

MESSAGE = b"Subject: hi\r\n\r\nhello\r\n"


def _worker_pid(pigeon: PigeonProcess, index: int) -> int:
    return int((pigeon.spool_path / f"shard-{index}" / "lock").read_text())


def _send(pigeon: PigeonProcess, count: int, recipient: str = "b@dst.test") -> None:
    for _ in range(count):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
            assert client.sendmail("a@src.test", [recipient], MESSAGE) == {}


def test_a_stopped_worker_is_killed_and_restarted_and_mail_still_flows(tmp_path: Path) -> None:
    with (
        ScriptedSink() as sink,
        PigeonProcess(
            tmp_path / "node", node={"workers": 2, "worker_timeout": "2s"}, **delivery_config(sink.endpoint)
        ) as pigeon,
    ):
        stopped = _worker_pid(pigeon, 1)
        os.kill(stopped, signal.SIGSTOP)
        _send(pigeon, 5)  # the other worker takes every connection meanwhile: one socket, shared
        said = pigeon.wait_stderr("restarting in", timeout=15)
        assert (
            f"worker 1 (pid {stopped}) has not answered the supervisor for 2s ([node] worker_timeout): "
            "killing it (SIGKILL) to start it again" in said
        )
        assert (
            "worker 1 was killed: it had not answered the supervisor for 2s ([node] worker_timeout); restarting in 1s"
            in said
        )
        deadline = time.monotonic() + 20
        while True:
            status, body = pigeon.http_get("/healthz")
            health = json.loads(body)
            if status == 200 and health["workers"][1]["restarts"] == 1 and health["workers"][1]["status"] == "ok":
                break
            assert time.monotonic() < deadline, health
            time.sleep(0.2)
        assert _worker_pid(pigeon, 1) != stopped
        _send(pigeon, 5)
        assert len(sink.wait_for(10, timeout=30)) == 10


def test_an_admin_request_gets_503_and_the_answers_of_the_workers_that_answered(tmp_path: Path) -> None:
    with PigeonProcess(
        tmp_path / "node", node={"workers": 2, "worker_timeout": "3s"}, delivery={"enabled": True}
    ) as pigeon:
        token = pigeon.local_token
        status, whole = pigeon.http_call("GET", "/api/v1/queues", token=token)
        assert status == 200, whole
        os.kill(_worker_pid(pigeon, 1), signal.SIGSTOP)
        started = time.monotonic()
        status, answer = pigeon.http_call("GET", "/api/v1/queues", token=token)
        assert time.monotonic() - started < 8  # the timeout (3 s), not the request's 600 s
        assert status == 503, answer
        assert answer["partial"] is True
        assert answer["answered"] == [0]
        assert [m["worker"] for m in answer["missing"]] == [1]
        assert "not every worker answered" in answer["error"]
        assert answer["answers"].keys() == whole.keys()  # worker 0's answer, as the API gives it
