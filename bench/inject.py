"""HTTP injection rate: templated 100-recipient requests, durable before the answer.

    .venv/bin/python bench/inject.py [--recipients 50000]

A node with delivery off (so only injection is measured) takes `--clients` concurrent
clients, each posting requests of 100 recipients, each recipient with its own
substitutions rendered into subject, text and HTML parts. In the same run, as the baseline,
the same node takes the same number of messages over SMTP from `smtp-source`. It prints
recipients per second and CPU milliseconds per recipient for both, and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
from harness import Pigeon, smtp_source, tree_cpu_seconds, workdir


def request_body(first: int, size: int) -> dict[str, object]:
    return {
        "envelope_sender": "news@example.org",
        "recipients": [
            {"email": f"user{n}@d{n % 50}.example", "name": f"User {n}", "substitutions": {"code": f"C{n:06d}"}}
            for n in range(first, first + size)
        ],
        "content": {
            "from": {"email": "news@example.org", "name": "Example News"},
            "subject": "Hello {{ name }}, your code",
            "text": "Dear {{ name }},\n\nyour code is {{ code }}.\n\n" + "Some newsletter text.\n" * 40,
            "html": "<p>Dear {{ name }},</p><p>your code is <b>{{ code }}</b>.</p>" + "<p>Text.</p>" * 40,
        },
        "campaign": "bench",
        "tenant": "acme",
    }


async def inject(port: int, token: str, recipients: int, clients: int, size: int) -> float:
    bodies = [request_body(first, size) for first in range(0, recipients, size)]
    queue: asyncio.Queue[dict[str, object]] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    headers = {"Authorization": f"Bearer {token}"}

    async def client(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            body = queue.get_nowait()
            async with session.post(f"http://127.0.0.1:{port}/api/v1/inject", json=body, headers=headers) as answer:
                result = await answer.json()
                assert answer.status == 200 and result["failed"] == 0, result

    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipients", type=int, default=50_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--size", type=int, default=100, help="recipients per request")
    args = parser.parse_args()
    with workdir("inject-") as path:
        node = Pigeon(path, 1, delivery={"enabled": False})
        try:
            token = (node.process.spool_path / "api-token").read_text().strip()
            asyncio.run(inject(node.process.http_port, token, 1000, 2, args.size))  # warm up
            cpu = tree_cpu_seconds(node.root_pid())
            seconds = asyncio.run(inject(node.process.http_port, token, args.recipients, args.clients, args.size))
            http_cpu = tree_cpu_seconds(node.root_pid()) - cpu
            cpu = tree_cpu_seconds(node.root_pid())
            started = time.perf_counter()
            smtp_source(
                node.port, "-s", "20", "-l", "5120", "-m", str(args.recipients), "-f", "a@b.test", "-t", "r@c.test"
            )
            smtp_seconds = time.perf_counter() - started
            smtp_cpu = tree_cpu_seconds(node.root_pid()) - cpu
        finally:
            node.stop()
    http_rate, smtp_rate = args.recipients / seconds, args.recipients / smtp_seconds
    print(f"HTTP inject ({args.size} recipients/request, templated, {args.clients} clients): "
          f"{http_rate:,.0f} recipients/s, {http_cpu * 1000 / args.recipients:.2f} CPU ms/recipient")  # fmt: skip
    print(f"SMTP baseline (smtp-source -s 20, 5 KiB): {smtp_rate:,.0f} messages/s, "
          f"{smtp_cpu * 1000 / args.recipients:.2f} CPU ms/message")  # fmt: skip
    print(f"HTTP / SMTP: {http_rate / smtp_rate:.2f}x")


if __name__ == "__main__":
    main()
