"""What a node loads to start: the clients of what it is not configured to use stay unloaded.

Every `pigeon serve` process (the supervisor, each worker) pays for each module it imports
before it serves, and the test suite starts about a thousand of them: the Redis client
(~100 ms of CPU), asyncpg, Jinja2 and cryptography are imported where the configuration or
a request first needs them. `pigeon serve` runs here in a process of its own, takes a
message over SMTP, stops on SIGTERM, and says what it had loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pigeon.listener.tls import ensure_self_signed
from tests.support.ports import free_port
from tests.support.process import to_toml

_SERVE = """
import json, os, signal, smtplib, sys, threading, time
from pigeon.cli.main import main

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
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=client, args=(int(sys.argv[2]),), daemon=True).start()
status = main(["serve", "-c", sys.argv[1]])
print(json.dumps([status, sorted(sys.modules)]))
"""


def _served(root: Path, **sections: dict[str, Any]) -> set[str]:
    """The modules `pigeon serve` (one worker, the default configuration but `sections`) had
    loaded once it had started, taken a message and stopped (its TLS pair made already, as
    at any restart)."""
    port = free_port()
    config: dict[str, Any] = {
        "node": {"workers": 1},
        "smtp": {"listen": [f"127.0.0.1:{port}"], "hostname": "mx.pigeon.test"},
        "http": {"listen": f"127.0.0.1:{free_port()}"},
        "spool": {"path": "spool"},
        "log": {"path": "log"},
        "dns": {"nameservers": ["127.0.0.1:9"], "timeout": "1s"},  # never the system resolver
        **sections,
    }
    (root / "pigeon.toml").write_text(to_toml(config))
    ensure_self_signed(root / "spool" / "tls", "mx.pigeon.test")
    result = subprocess.run(
        [sys.executable, "-c", _SERVE, str(root / "pigeon.toml"), str(port)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    status, names = json.loads(result.stdout.splitlines()[-1])
    assert status == 0, result.stderr
    modules = set(names)
    assert {"pigeon.node.node", "pigeon.intake", "aiohttp"} <= modules  # it did run
    return modules


def _of(package: str, modules: set[str]) -> set[str]:
    return {name for name in modules if name == package or name.startswith(package + ".")}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    return _served(tmp_path_factory.mktemp("node"))


@pytest.mark.parametrize(
    "package",
    [
        pytest.param("redis", id="a node without redis does not load the redis client"),
        pytest.param("asyncpg", id="a node without a postgresql target does not load asyncpg"),
        pytest.param("jinja2", id="a node that renders no template does not load jinja2"),
        pytest.param("cryptography", id="a node without dkim that finds its tls pair does not load cryptography"),
        pytest.param("pigeon.node.supervisor", id="a node of one worker does not load the supervisor"),
    ],
)
def test_a_default_node_does_not_load_what_it_does_not_use(loaded: set[str], package: str) -> None:
    assert not _of(package, loaded)
    assert _of("dns", loaded) and _of("pigeon.node.outbound", loaded)  # it delivers


def test_a_node_that_only_accepts_does_not_load_the_delivery_side(tmp_path: Path) -> None:
    loaded = _served(tmp_path, delivery={"enabled": False})
    for package in ("pigeon.node.outbound", "pigeon.delivery.session", "dns", "pigeon.inbound.mailbox"):
        assert not _of(package, loaded), package


def test_a_supervisor_does_not_load_the_node_nor_the_clients_it_does_not_use() -> None:
    script = "import json, sys, pigeon.cli.main, pigeon.cli.serve, pigeon.node.supervisor\n"
    script += "print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(json.loads(result.stdout))
    for package in ("pigeon.node.node", "pigeon.node.outbound", "redis", "asyncpg", "jinja2", "cryptography"):
        assert not _of(package, loaded), package
