"""What a `pigeon serve` process loads to start: the clients of what it is not configured to
use stay unloaded, and once it serves its garbage collector runs.

Every `pigeon serve` process (the supervisor, each worker) pays for each module it imports
before it serves, and the test suite starts about a thousand of them: the Redis client
(~100 ms of CPU), asyncpg, Jinja2, cryptography and, in a node that only accepts, the whole
delivery side are imported where the configuration or a request first needs them; and the
cyclic collector is off while the process starts (`pigeon.node.collector`). `pigeon serve`
runs here in a process of its own, takes a message over SMTP, says how its collector stands
while it serves, stops on SIGTERM and says what it had loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pigeon.listener.tls import ensure_self_signed
from tests.support.ports import free_port
from tests.support.process import to_toml

_SERVE = """
import gc, json, os, signal, smtplib, sys, threading, time
from pigeon.cli.main import main

collector = {}

def client(port):
    deadline = time.monotonic() + 30
    while True:
        try:
            with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
                smtp.sendmail("ann@example.org", ["bob@example.net"], b"Subject: hi\\r\\n\\r\\nbody\\r\\n")
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    collector.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count())
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=client, args=(int(sys.argv[2]),), daemon=True).start()
status = main(["serve", "-c", sys.argv[1]])
print(json.dumps({"status": status, "modules": sorted(sys.modules), "collector": collector}))
"""


@dataclass
class Served:
    modules: set[str]
    collector: dict[str, Any]  # while it served: enabled, frozen (objects)

    def loaded(self, package: str) -> bool:
        return any(name == package or name.startswith(package + ".") for name in self.modules)


def _serve(root: Path, **sections: dict[str, Any]) -> Served:
    """`pigeon serve` (one worker and the default configuration, but `sections`) run until it
    took a message, with its TLS pair made already (as at any restart)."""
    port = free_port()
    config: dict[str, Any] = {
        "node": {"workers": 1},
        "smtp": {"listen": [f"127.0.0.1:{port}"], "hostname": "mx.pigeon.test"},
        "http": {"listen": f"127.0.0.1:{free_port()}"},
        "spool": {"path": "spool"},
        "log": {"path": "log"},
        "dns": {"nameservers": ["127.0.0.1:9"], "timeout": "1s"},  # never the system resolver
    }
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    (root / "pigeon.toml").write_text(to_toml(config))
    ensure_self_signed(root / "spool" / "tls", "mx.pigeon.test")
    command = [sys.executable, "-c", _SERVE, str(root / "pigeon.toml"), str(port)]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout.splitlines()[-1])
    assert answer["status"] == 0, result.stderr
    return Served(set(answer["modules"]), answer["collector"])


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Served:
    served = _serve(tmp_path_factory.mktemp("node"))
    assert served.loaded("pigeon.node.node") and served.loaded("pigeon.node.outbound")  # a node that delivers
    return served


@pytest.mark.parametrize(
    "package",
    [
        pytest.param("redis", id="a node without redis does not load the redis client"),
        pytest.param("asyncpg", id="a node without a postgresql target does not load asyncpg"),
        pytest.param("jinja2", id="a node that renders no template does not load jinja2"),
        pytest.param("cryptography", id="a node without dkim that finds its tls pair does not load cryptography"),
        pytest.param("pigeon.inbound.mailbox", id="a node without a mailbox does not load the imap side"),
        pytest.param("pigeon.node.supervisor", id="a node of one worker does not load the supervisor"),
    ],
)
def test_a_default_node_does_not_load_what_it_does_not_use(node: Served, package: str) -> None:
    assert not node.loaded(package)


def test_a_node_collects_garbage_once_it_serves(node: Served) -> None:
    assert node.collector["enabled"]
    assert node.collector["frozen"] > 10_000  # what start-up made, out of every collection


def test_a_node_that_only_accepts_does_not_load_the_delivery_side(tmp_path: Path) -> None:
    served = _serve(tmp_path, delivery={"enabled": False})
    for package in ("pigeon.node.outbound", "pigeon.delivery.session", "dns"):
        assert not served.loaded(package), package


def test_a_supervisor_loads_no_node_and_collects_garbage_once_it_serves(tmp_path: Path) -> None:
    served = _serve(tmp_path, node={"workers": 2})  # this process supervises, its workers serve
    assert served.loaded("pigeon.node.supervisor")
    for package in ("pigeon.node.node", "pigeon.node.outbound", "redis", "asyncpg", "jinja2", "cryptography"):
        assert not served.loaded(package), package
    assert served.collector["enabled"]
