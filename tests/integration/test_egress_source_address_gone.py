"""A `[[source]]` address this machine cannot bind stops only the node's first start (a typo).
Once the node runs, an address gone from the machine (or a reload naming one not there yet) is
a WARNING naming the source: the reload is taken, a worker started again serves, and the
commands that read the file work; the source's mail waits with 451 4.4.1 meanwhile.

192.0.2.1 (TEST-NET-1) is on no interface of a test machine: binding it fails with
EADDRNOTAVAIL without a packet sent, and without changing the machine's addresses."""

from __future__ import annotations

import json
import os
import re
import signal
import smtplib
import time
from pathlib import Path

from tests.support import zygote
from tests.support.process import PigeonProcess, to_toml
from tests.support.sinks import ScriptedSink, delivery_config

GONE = "192.0.2.1"
SOURCES = [{"name": "ip-2", "bind": "127.0.0.2", "ehlo": "ip2.example"}]
POOLS = [{"name": "main", "sources": ["ip-2"]}]


def _send(pigeon: PigeonProcess, recipient: str) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
        client.sendmail("a@example.org", [recipient], b"From: a@example.org\r\nSubject: gone\r\n\r\nhi\r\n")


def _file_with_source_at(pigeon: PigeonProcess, bind: str) -> None:
    """The operator's edit: ip-2's address is now `bind`."""
    config = json.loads(json.dumps(pigeon.config))
    config["source"] = [{**SOURCES[0], "bind": bind}]
    pigeon.config_path.write_text(to_toml(config))


def _healthy(pigeon: PigeonProcess, restarts: int) -> bool:
    status, body = pigeon.http_get("/healthz")
    workers = json.loads(body)["workers"]
    return status == 200 and workers[1]["restarts"] == restarts and all(w["status"] == "ok" for w in workers)


def test_a_reload_and_a_worker_restart_with_a_source_that_cannot_be_bound_warn_and_keep_serving(
    tmp_path: Path,
) -> None:
    config = delivery_config("", pool="main")
    config["node"] = {"workers": 2}
    with ScriptedSink() as sink:
        config["route"][0]["next_hop"] = sink.endpoint
        with PigeonProcess(tmp_path / "node", tables={"source": SOURCES, "pool": POOLS}, **config) as pigeon:
            assert pigeon.process is not None
            _send(pigeon, "before@d.example")
            sink.wait_for(1, timeout=20)

            # A reload while the file names an address that cannot be bound: taken, with a warning.
            _file_with_source_at(pigeon, GONE)
            pigeon.process.send_signal(signal.SIGHUP)
            said = pigeon.wait_stderr("reloaded:", count=2, timeout=20)
            assert "reload failed" not in said and "configuration error" not in said, said
            named = rf" WARNING \S+: \[\[source\]\] #1 bind: source 'ip-2': cannot bind to {GONE}: .*"
            warning = re.search(named, said)
            assert warning is not None, said
            assert "mail from it waits (451 4.4.1)" in warning.group(0)

            # A worker killed now is started again (on the node's start text, the reload's
            # taken before it serves) and serves: its shard's mail does not stall.
            os.kill(pigeon.shard_owner(1), signal.SIGKILL)
            deadline = time.monotonic() + 20
            while not _healthy(pigeon, restarts=1):
                assert time.monotonic() < deadline, pigeon.http_get("/healthz")
                time.sleep(0.2)
            assert "cannot start" not in pigeon.stderr(), pigeon.stderr()
            for index in range(6):  # (to both workers, whichever the kernel gives each to)
                _send(pigeon, f"after{index}@d.example")
            received = sink.wait_for(7, timeout=30)
            # The running source stays the node start's (a [[source]] change waits for a restart).
            assert {arrival.peer for arrival in sink.arrivals} == {"127.0.0.2"}
            assert len(received) == 7

            # The commands that read the file say it and go on.
            for command in (["shaping", "check", str(pigeon.config_path)], ["shaping", "explain", "d.example"]):
                extra = [] if command[1] == "check" else ["-c", str(pigeon.config_path)]
                shown = zygote.run(
                    [*command, *extra],
                    text=True,
                    timeout=60,
                    cwd=pigeon.root,
                )
                assert shown.returncode == 0, shown.stdout + shown.stderr
                assert f"pigeon: warning: [[source]] #1 bind: source 'ip-2': cannot bind to {GONE}" in shown.stderr


def test_a_source_address_that_cannot_be_bound_stops_the_nodes_first_start(tmp_path: Path) -> None:
    sources = [{**SOURCES[0], "bind": GONE}]
    config = delivery_config("127.0.0.1:9", pool="main")
    config["node"] = {"workers": 2}
    pigeon = PigeonProcess(tmp_path / "node", tables={"source": sources, "pool": POOLS}, **config)
    pigeon.start(wait=False)
    try:
        assert pigeon.wait_exit() == 2
    finally:
        pigeon.kill()
    said = pigeon.stderr()
    assert f"configuration error: {pigeon.config_path}, line" in said
    assert f"[[source]] #1 bind: source 'ip-2': cannot bind to {GONE}: Cannot assign requested address" in said
