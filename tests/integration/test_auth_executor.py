"""Password checks run on threads of their own, so busy file writers cannot stall AUTH.

The node runs in this process, so the test can fill the loop's default executor (the one
the Maildir and log targets write through) with jobs that block; the SMTP client runs on a
thread of its own, as a separate program would.
"""

from __future__ import annotations

import asyncio
import base64
import smtplib
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pigeon.config.load import load
from pigeon.listener.passwords import set_password
from pigeon.node.node import Node
from tests.support.process import free_port, to_toml

PASSWORD = "wonderland"


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    set_password(tmp_path / "users", "alice", PASSWORD)
    config = {
        "node": {"name": "auth", "workers": 1},
        "smtp": {
            "listen": [f"127.0.0.1:{free_port()}"],
            "hostname": "mx.pigeon.test",
            "auth_users": "users",
            "allow_plaintext_auth": True,  # this test is about threads, not TLS
        },
        "http": {"listen": f"127.0.0.1:{free_port()}"},
        "spool": {"path": "spool"},
        "log": {"path": "log"},
        "delivery": {"enabled": False},
        "dns": {"nameservers": ["127.0.0.1:9"], "timeout": "1s"},
    }
    (tmp_path / "pigeon.toml").write_text(to_toml(config))
    node = Node(load(tmp_path / "pigeon.toml"))
    await node.start()
    yield node
    await node.stop()


def _auth(port: int) -> tuple[int, bytes]:
    with smtplib.SMTP("127.0.0.1", port, timeout=5) as client:
        client.ehlo()
        token = base64.b64encode(f"\0alice\0{PASSWORD}".encode()).decode()
        return client.docmd("AUTH", f"PLAIN {token}")


async def test_auth_is_answered_while_the_default_executor_is_saturated(node: Node) -> None:
    loop = asyncio.get_running_loop()
    default = ThreadPoolExecutor(max_workers=2, thread_name_prefix="default")
    loop.set_default_executor(default)
    release = threading.Event()
    # Every default thread busy, and more work queued behind them: a slow disk under Maildir.
    blockers = [loop.run_in_executor(None, release.wait) for _ in range(6)]
    client = ThreadPoolExecutor(max_workers=1, thread_name_prefix="client")
    assert node.smtp_addresses
    port = node.smtp_addresses[0][1]
    try:
        reply = await loop.run_in_executor(client, _auth, port)
        assert reply == (235, b"2.7.0 Authentication successful")
        assert any(t.name.startswith("pigeon-auth") for t in threading.enumerate())
    finally:
        release.set()
        await asyncio.gather(*blockers)
        client.shutdown()
