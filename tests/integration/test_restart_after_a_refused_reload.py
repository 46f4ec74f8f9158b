"""After a refused reload the node runs on with what it read before: a worker that dies and is
started again starts with that too (its last good configuration), not with the broken files."""

from __future__ import annotations

import json
import os
import re
import signal
import smtplib
import time
from pathlib import Path

from pigeon.dkim.keys import generate_key, write_key
from tests.support.process import PigeonProcess

MESSAGE = b"From: a@example.com\r\nSubject: restart\r\n\r\nhello\r\n"


def _hangup(pigeon: PigeonProcess, outcome: str) -> None:
    assert pigeon.process is not None
    before = pigeon.stderr().count(outcome)
    pigeon.process.send_signal(signal.SIGHUP)
    pigeon.wait_stderr(outcome, before + 2)  # both workers


def _kill_worker(pigeon: PigeonProcess, index: int) -> None:
    pid = re.findall(rf"worker {index} started \(pid (\d+)\)", pigeon.stderr())[-1]
    os.kill(int(pid), signal.SIGKILL)
    pigeon.wait_stderr(f"worker {index} was killed by SIGKILL")


def _health(pigeon: PigeonProcess) -> tuple[int, dict]:
    status, body = pigeon.http_get("/healthz")
    return status, json.loads(body)


def _wait_degraded(pigeon: PigeonProcess, index: int) -> dict:
    deadline = time.monotonic() + 20
    while True:
        status, health = _health(pigeon)
        worker = health["workers"][index]
        if worker["status"] == "degraded" and worker.get("restarts") == 1:
            assert status == 200 and health["status"] == "degraded"
            return worker
        assert time.monotonic() < deadline, (health, pigeon.stderr())
        time.sleep(0.1)


def _accepts_mail(pigeon: PigeonProcess) -> None:
    for _ in range(6):  # whichever worker takes the connection
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
            assert client.sendmail("a@example.com", ["b@dst.test"], MESSAGE) == {}


def test_a_worker_restarted_after_a_refused_key_reload_starts_with_the_running_keys(tmp_path: Path) -> None:
    key = tmp_path / "dkim.pem"
    write_key(key, generate_key("rsa-sha256"))
    good = key.read_bytes()
    dkim = [{"domain": "example.com", "selector": "rsa1", "private_key": str(key)}]
    with PigeonProcess(tmp_path / "node", node={"workers": 2}, dkim=dkim) as pigeon:
        key.write_text("garbage\n")
        _hangup(pigeon, "reload failed; the running configuration stays")
        _kill_worker(pigeon, 0)
        said = pigeon.wait_stderr("worker 0 restarted with the node's last good configuration", timeout=20)
        assert "holds no PEM private key" in said
        assert "cannot start" not in said
        worker = _wait_degraded(pigeon, 0)
        assert "running the last good configuration" in worker["config"]["error"]
        assert "holds no PEM private key" in worker["config"]["error"]
        _accepts_mail(pigeon)
        records = pigeon.wait_records("Reception", 6)
        assert len(records) == 6
        # Fixed on disk and reloaded: the worker runs the files again, and says so.
        key.write_bytes(good)
        _hangup(pigeon, "reloaded:")
        pigeon.wait_stderr("reload: the files on disk load again")
        status, health = _health(pigeon)
        assert status == 200 and health["status"] == "ok", health


def test_a_worker_restarted_after_a_policy_with_a_syntax_error_starts_with_the_running_policy(tmp_path: Path) -> None:
    policy = tmp_path / "mypolicy.py"
    policy.write_text("from pigeon.policy import Refuse\ndef on_rcpt_to(r):\n    return Refuse(550, 'kept policy')\n")
    with PigeonProcess(tmp_path / "node", node={"workers": 2}, policy={"module": str(policy)}) as pigeon:
        policy.write_text("def on_rcpt_to(r) oops\n")
        _hangup(pigeon, "reload: the policy module stays as it was")
        _kill_worker(pigeon, 1)
        said = pigeon.wait_stderr("worker 1 restarted with the node's last good configuration", timeout=20)
        assert "SyntaxError" in said and "cannot start" not in said
        _wait_degraded(pigeon, 1)
        for _ in range(6):  # both workers refuse with the policy that runs
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                client.ehlo()
                client.mail("a@example.com")
                code, text = client.rcpt("b@dst.test")
                assert (code, text) == (550, b"5.7.1 kept policy")


def test_a_node_started_anew_with_a_broken_key_still_refuses_to_start(tmp_path: Path) -> None:
    key = tmp_path / "dkim.pem"
    write_key(key, generate_key("rsa-sha256"))
    dkim = [{"domain": "example.com", "selector": "rsa1", "private_key": str(key)}]
    pigeon = PigeonProcess(tmp_path / "node", node={"workers": 2}, dkim=dkim)
    with pigeon:
        pass  # a run that kept its last good configuration
    key.write_text("garbage\n")
    try:
        pigeon.start(wait=False)
        assert pigeon.wait_exit() != 0
        assert "holds no PEM private key" in pigeon.stderr()
        assert "last good configuration" not in pigeon.stderr()
    finally:
        pigeon.kill()
