"""Nodes of one cluster for the admin tests: each its own spool and ports, one Redis, one
sink, and the operator's token."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.sinks import delivery_config

ADMIN = "admin-token-0123456789"
TOKENS = [{"name": "ops", "token": ADMIN, "scopes": ["admin", "read"]}]


@contextmanager
def admin_cluster(
    root: Path,
    sink_endpoint: str,
    redis_url: str,
    workers: Sequence[tuple[str, int]],
    *,
    redis: dict[str, Any] | None = None,
    **node: Any,
) -> Iterator[tuple[PigeonProcess, ...]]:
    """A node per `(name, workers)`, started in that order and stopped together; `node` adds
    to each one's `[node]` section, `redis` to its `[redis]`. Mail waits an hour after a failed attempt."""
    with ExitStack() as stack:
        yield tuple(
            stack.enter_context(
                PigeonProcess(
                    root / name,
                    node={"name": name, "workers": count, **node},
                    http={"token": TOKENS},
                    redis={"url": redis_url, "timeout": "1s", **(redis or {})},
                    **delivery_config(sink_endpoint, retry_interval="1h"),
                )
            )
            for name, count in workers
        )


def admin_command(node: PigeonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """`pigeon ARGS` run against `node`'s HTTP API with the operator's token."""
    return zygote.run(
        [*args, "--url", f"http://127.0.0.1:{node.http_port}", "--token", ADMIN],
        text=True,
        timeout=90,
    )


def inject(node: PigeonProcess, recipient: str, count: int) -> list[str]:
    """`count` messages to `recipient`, by the API (a supervisor passes them to its workers in
    turn): their ids."""
    ids = []
    for n in range(count):
        status, answer = node.http_post(
            "/api/v1/inject",
            {
                "envelope_sender": "sender@example.org",
                "content": f"From: a@example.org\r\nSubject: {n}\r\n\r\nhello\r\n",
                "recipients": [{"email": recipient}],
            },
            node.local_token,
        )
        assert status == 200, answer
        ids.append(str(answer["recipients"][0]["id"]))
    return ids
