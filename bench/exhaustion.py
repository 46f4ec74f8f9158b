"""Resource exhaustion at full size: the worker's memory and whether the node still serves.

    .venv/bin/python bench/exhaustion.py [--only slowloris]

Each case starts a fresh one-worker node, reads the worker's RSS (VmRSS), runs the attack
while sampling RSS every 20 ms and while a well-behaved client (from 127.0.0.2) sends one
message, then ends the attack and reads RSS again a second later. It prints one row per
case: RSS before, at its peak, after; whether the well-behaved client got 250; what the
attacker was told. The attackers and their figures are those of
tests/integration/test_exhaustion.py at full size.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import workdir
from tests.support.attacks import (
    GOOD_CLIENT,
    RssPeak,
    connect,
    drip,
    last_replies,
    nested_multipart,
    open_crowd,
    post_without_token,
    raised_open_files,
    read_reply,
    send_message,
    sources,
    worker_rss_mib,
)
from tests.support.process import PigeonProcess

ONLY_GOOD_RELAYS = {"relay_networks": [f"{GOOD_CLIENT}/32"]}
SLOWLORIS_TIMEOUT = 30.0


@dataclass
class Row:
    case: str
    before: float
    peak: float
    after: float
    served: str
    replies: str


def tally(codes: list[int]) -> str:
    return ", ".join(f"{n}x{code or 'no reply'}" for code, n in sorted(Counter(codes).items()))


async def served_meanwhile(attack: Awaitable[str], port: int, delay: float = 0.5) -> tuple[str, str]:
    """Run the attack; `delay` seconds in, a well-behaved client sends a message."""
    task = asyncio.ensure_future(attack)
    await asyncio.sleep(delay)
    try:
        good = await send_message(port, within=30)
        served = f"yes ({good[0]})" if good[0] == 250 else f"NO ({good[0]} {good[1]})"
    except (TimeoutError, OSError) as error:
        served = f"NO ({error!r})"
    return served, await task


async def idle_one_address(pigeon: PigeonProcess) -> str:
    crowd = await open_crowd(pigeon.smtp_port, 10_000, ["127.0.0.1"])
    await asyncio.sleep(2)  # held while the good client sends
    crowd.close()
    return "greetings " + tally(crowd.greetings)


async def idle_many_addresses(pigeon: PigeonProcess) -> str:
    crowd = await open_crowd(pigeon.smtp_port, 10_000, sources(10_000))
    evicted = await last_replies(crowd, within=2.0)
    crowd.close()
    return f"greetings {tally(crowd.greetings)}; then {tally(evicted)}"


async def slowloris(pigeon: PigeonProcess) -> str:
    crowd = await open_crowd(pigeon.smtp_port, 2000, sources(2000))
    dripping = asyncio.ensure_future(drip(crowd, b"EHLO " + b"s" * 60 + b".test\r\n", 1.0, SLOWLORIS_TIMEOUT + 2))
    codes = await last_replies(crowd, within=SLOWLORIS_TIMEOUT + 5)
    await dripping
    crowd.close()
    return f"greetings {tally(crowd.greetings)}; after {SLOWLORIS_TIMEOUT:.0f}s {tally(codes)}"


async def long_lines(pigeon: PigeonProcess) -> str:
    """On two connections (each error counts against [smtp] max_errors, 20)."""

    async def session(exchange: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[int]]) -> list[int]:
        reader, writer = await connect(pigeon.smtp_port, GOOD_CLIENT)
        await read_reply(reader)
        writer.write(b"EHLO attacker.test\r\n")
        await read_reply(reader)
        codes = [await exchange(reader, writer) for _ in range(15)]
        writer.close()
        return codes

    async def command(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        writer.write(b"MAIL FROM:<" + b"a" * (1 << 20) + b"@example.org>\r\n")
        return (await read_reply(reader))[0]

    async def header(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        writer.write(b"MAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\nDATA\r\n")
        for _ in range(3):
            await read_reply(reader)
        writer.write(b"Subject: " + b"x" * (1 << 20) + b"\r\n\r\nbody\r\n.\r\n")
        return (await read_reply(reader))[0]

    commands, headers = await session(command), await session(header)
    return f"1 MiB command line {tally(commands)}; 1 MiB header line {tally(headers)}"


async def many_recipients(pigeon: PigeonProcess) -> str:
    reader, writer = await connect(pigeon.smtp_port, GOOD_CLIENT)
    await read_reply(reader)
    writer.write(b"EHLO many.test\r\nMAIL FROM:<a@example.org>\r\n")
    writer.write(b"".join(b"RCPT TO:<r%d@example.net>\r\n" % n for n in range(10_000)) + b"DATA\r\n")
    codes = [(await read_reply(reader))[0] for _ in range(2 + 10_000 + 1)]
    writer.write(b"Subject: many\r\n\r\nhello\r\n.\r\n")
    codes.append((await read_reply(reader))[0])
    writer.close()
    return f"RCPT {tally(codes[2:-2])}; DATA {codes[-2]}, end of data {codes[-1]}"


async def mime_nesting(pigeon: PigeonProcess) -> str:
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": "ann@example.net"}],
        "content": nested_multipart(100),
        "template": False,
    }
    answers = [
        await asyncio.to_thread(pigeon.http_post, "/api/v1/inject", request, pigeon.local_token) for _ in range(20)
    ]
    return "HTTP " + tally([status for status, _ in answers]) + " (20 requests)"


async def api_body_without_token(pigeon: PigeonProcess) -> str:
    uploads = [asyncio.to_thread(post_without_token, pigeon.http_port, 64 << 20) for _ in range(8)]
    return "HTTP " + tally(list(await asyncio.gather(*uploads))) + " (8 concurrent 64 MiB bodies)"


CASES: dict[str, tuple[str, Callable[[PigeonProcess], Awaitable[str]], dict[str, Any]]] = {
    "idle-one": ("10,000 idle connections, one address", idle_one_address, {}),
    "idle-many": ("10,000 idle connections, 10,000 addresses", idle_many_addresses, {}),
    "slowloris": (
        "slowloris: 2,000 connections, 1 byte/s",
        slowloris,
        {"command_timeout": f"{SLOWLORIS_TIMEOUT:.0f}s", "max_connections": 2100},
    ),
    "lines": ("1 MiB command line, 1 MiB header line (15 each)", long_lines, {}),
    "recipients": ("10,000 recipients in one transaction", many_recipients, {}),
    "mime": ("100-level MIME nesting through /api/v1/inject", mime_nesting, {}),
    "api": ("64 MiB API body without a token", api_body_without_token, {}),
}


def run_case(root: Path, case: str) -> Row:
    title, attack, smtp = CASES[case]
    with PigeonProcess(root / case, smtp={**ONLY_GOOD_RELAYS, **smtp}) as pigeon:
        time.sleep(1)
        before = worker_rss_mib(pigeon)
        with RssPeak(pigeon) as rss:
            served, replies = asyncio.run(served_meanwhile(attack(pigeon), pigeon.smtp_port))
        time.sleep(1)
        after = worker_rss_mib(pigeon)
    return Row(title, before, rss.peak_mib, after, served, replies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(CASES), action="append", help="run only these cases")
    args = parser.parse_args()
    rows = []
    with raised_open_files(25_000), workdir("exhaustion-") as root:
        for case in args.only or list(CASES):
            rows.append(run_case(root, case))
            print(f"  {case}: done", flush=True)
    print()
    print("| case | RSS before | peak | after | normal client served | attacker was told |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row.case} | {row.before:.0f} MiB | {row.peak:.0f} MiB | {row.after:.0f} MiB "
            f"| {row.served} | {row.replies} |"
        )


if __name__ == "__main__":
    main()
