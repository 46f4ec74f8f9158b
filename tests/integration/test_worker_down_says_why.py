"""A worker that is down says why in /healthz, as the supervisor's log does: an operator who
probes the node, or a load balancer's page, learns what to fix without reading the log."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from pigeon.dkim.keys import generate_key, write_key
from tests.support.process import PigeonProcess


def _health(pigeon: PigeonProcess) -> tuple[int, dict[str, Any]]:
    status, body = pigeon.http_get("/healthz")
    return status, json.loads(body)


def test_a_worker_that_cannot_start_after_a_refused_reload_is_down_in_healthz_with_the_reason(tmp_path: Path) -> None:
    key = tmp_path / "keys" / "example.com.s1.pem"
    key.parent.mkdir()
    write_key(key, generate_key("rsa-sha256"))
    dkim = [{"domain": "example.com", "selector": "s1", "private_key": str(key)}]
    with PigeonProcess(tmp_path / "node", node={"workers": 2}, dkim=dkim) as pigeon:
        assert pigeon.process is not None
        key.write_text("not a key\n")  # replaced by junk: the reload is refused...
        pigeon.process.send_signal(signal.SIGHUP)
        pigeon.wait_stderr("reload failed", count=2)
        # ...and a worker that dies now reads the files as they are at its start: it cannot.
        pid = pigeon.shard_owners()[1]
        os.kill(pid, signal.SIGKILL)
        pigeon.wait_stderr("worker 1: cannot start: configuration error", timeout=20)
        deadline = time.monotonic() + 10
        while True:
            status, health = _health(pigeon)
            down = health["workers"][1]
            if "holds no PEM private key" in down.get("error", ""):
                break
            assert time.monotonic() < deadline, health
            time.sleep(0.1)
        assert status == 503 and health["status"] == "down"
        assert (down["worker"], down["status"]) == (1, "down") and down["restarts"] >= 1
        # As the log says it, file and key included: what to fix.
        assert "configuration error: " in down["error"] and str(key) in down["error"], down
        # Worker 0 serves on with the keys it had, and says its reload was refused.
        up = health["workers"][0]
        assert (up["status"], up["config"]["status"]) == ("degraded", "degraded"), up
        assert "the last reload failed" in up["config"]["error"] and str(key) in up["config"]["error"], up
