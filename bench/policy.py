"""What policy hooks cost: relaying with a no-op policy module against none, in one invocation.

    .venv/bin/python bench/policy.py [--messages 10000] [--rounds 3] [--modes none,empty,noop,async]

smtp-source -> Pigeon (one worker) -> smtp-sink, as bench/relay.py, once per contender and
round, the contenders alternating (reversed every other round). Contenders:

* `none`: no [policy] at all;
* `empty`: a policy module that defines no hook (an undefined hook must cost nothing);
* `noop`: all six hooks defined, plain functions returning None (`sync = "inline"`, the default);
* `async`: all six hooks `async def`, returning None;
* `thread`: all six plain, with `sync = "thread"`.

It prints each run's end-to-end rate and CPU per message, then the medians and each
contender's ratio to `none` (the issue's target: `noop` costs at most 5%).

`--calls N` first measures one hook call in this process, N times each way: inline, async
(a task), and on a thread (what `sync = "thread"` costs per call); then one message's worth
of no-op hook work (six objects built, six calls), which it sets against the CPU per message
of `none`: a figure the machine's noise moves far less than an end-to-end rate.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from harness import (
    SMTP_SOURCE,
    Pigeon,
    free_port,
    median,
    require,
    timed_relay,
    warm_up,
    workdir,
)
from harness import smtp_sink as sink

from pigeon.message import Envelope, Message, Recipient, SpoolId
from pigeon.policy.delivery import DeliveryHooks
from pigeon.policy.hooks import HOOKS, Policy
from pigeon.policy.objects import Connection, Headers, MailFrom, RcptTo, ReceivedMessage
from pigeon.queue.attempt import Attempt
from pigeon.smtp.replies import Reply

MODES = ("none", "empty", "noop", "async", "thread")


def module_source(mode: str) -> str | None:
    if mode == "none":
        return None
    if mode == "empty":
        return "# a policy module without hooks\n"
    prefix = "async " if mode == "async" else ""
    return "".join(f"{prefix}def {name}(argument):\n    return None\n\n" for name in HOOKS)


def one_run(mode: str, args: argparse.Namespace) -> tuple[float, float]:
    """Messages per second end to end, and CPU milliseconds per message of the node."""
    sink_port = free_port()
    with workdir(f"policy-{mode}-") as path:
        sections: dict[str, Any] = {
            "delivery": {"enabled": True, "retry_interval": "1s", "max_retry_interval": "2s", "connection_limit": 32},
            "route": [{"domain": "*", "next_hop": f"127.0.0.1:{sink_port}", "tls": "disabled"}],
        }
        source = module_source(mode)
        if source is not None:
            module = path / "noop_policy.py"
            module.write_text(source)
            sections["policy"] = {"module": str(module), "sync": "thread" if mode == "thread" else "inline"}
        warm = sink(sink_port, 200)
        mta = Pigeon(path / "node", 1, **sections)
        try:
            warm_up(mta.port, warm, args.size)
            return timed_relay(mta.port, mta.root_pid(), sink_port, args.size, args.sessions, args.messages)
        finally:
            mta.stop()


async def per_call(calls: int) -> None:
    """Microseconds per hook call (no-op hook), made each way."""
    with workdir("policy-calls-") as path:
        for mode in ("noop", "async", "thread"):
            source = module_source(mode)
            assert source is not None
            module = path / f"calls_{mode}.py"
            module.write_text(source)
            policy = Policy(str(module), sync="thread" if mode == "thread" else "inline")
            policy.load()
            hook = policy.on_mail_from
            assert hook is not None
            started = time.perf_counter()
            for _ in range(calls):
                verdict = hook(None)
                if isinstance(verdict, asyncio.Future):
                    await verdict
            elapsed = time.perf_counter() - started
            policy.close()
            label = {"noop": "inline (plain)", "async": "async (a task)", "thread": 'on a thread (sync = "thread")'}
            print(f"one hook call, {label[mode]:32} {elapsed / calls * 1e6:8.2f} us", flush=True)


async def per_message(messages: int) -> float:
    """Microseconds of hook work per message with a no-op module: the six objects built and the
    six hooks called as Pigeon does for a message relayed in a connection of its own (the
    delivery side through the real `DeliveryHooks`). Without a policy this work is skipped."""
    with workdir("policy-message-") as path:
        module = path / "per_message.py"
        module.write_text(module_source("noop") or "")
        policy = Policy(str(module))
        policy.load()
        delivery = DeliveryHooks(policy, lambda reply: "", lambda message: (None, None))
        envelope = Envelope("a@src.test", [Recipient("r@sink.test")])
        message = Message(SpoolId(1), "sink.test", envelope, time.time(), 5120, SpoolId(1))
        head = b"Received: from x\r\nFrom: <a@src.test>\r\nSubject: test\r\n"
        attempt = Attempt([Reply(250, "2.0.0", ("ok",))], [""], "127.0.0.1:25", "127.0.0.1:25")
        hooks = (policy.on_connect, policy.on_mail_from, policy.on_rcpt_to, policy.on_message)
        assert all(hook is not None for hook in hooks)
        on_connect, on_mail_from, on_rcpt_to, on_message = hooks  # type: ignore[misc]
        started = time.perf_counter()
        for _ in range(messages):
            on_connect(Connection("s", "127.0.0.1", 40000, "127.0.0.1", 25), session="s")
            on_mail_from(MailFrom("s", "127.0.0.1", "h", "a@src.test", None, False, None, None), session="s")
            on_rcpt_to(RcptTo("s", "127.0.0.1", "h", "a@src.test", "r@sink.test", (), None, None), session="s")
            on_message(
                ReceivedMessage(
                    "0000000000000001", "smtp", "s", "127.0.0.1", "h", "ESMTP", None, None,
                    "a@src.test", ("r@sink.test",), 5120, Headers(head), None, None, {},
                ),
                session="s",
                message_id="0000000000000001",
            )  # fmt: skip
            told = delivery.delivery(message, "127.0.0.1:25")
            delivery.before(message, told)
            delivery.after(message, attempt, told)
        elapsed = time.perf_counter() - started
        return elapsed / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--size", type=int, default=5120)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="none,empty,noop,async", help=f"of {','.join(MODES)}")
    parser.add_argument("--calls", type=int, default=0, help="also time N single hook calls each way")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",")]
    for mode in modes:
        if mode not in MODES:
            parser.error(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    require(SMTP_SOURCE, "postfix")
    hook_us = None
    if args.calls:
        asyncio.run(per_call(args.calls))
        hook_us = asyncio.run(per_message(args.calls))
        print(f"one message's hook work (six objects, six no-op calls): {hook_us:.1f} us", flush=True)
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    for round_no in range(args.rounds):
        for mode in modes if round_no % 2 == 0 else list(reversed(modes)):
            rate, cpu = one_run(mode, args)
            results[mode].append((rate, cpu))
            print(f"round {round_no + 1}: {mode:7} {rate:8.0f} msg/s end to end  {cpu:5.2f} CPU ms/msg", flush=True)
    if not args.rounds:
        return
    load = f"smtp-source -s {args.sessions} -l {args.size} -m {args.messages}"
    print(f"\n{load} -> pigeon (1 worker) -> smtp-sink, medians:")
    summary = {mode: (median([r for r, _ in v]), median([c for _, c in v])) for mode, v in results.items()}
    for mode, (rate, cpu) in summary.items():
        print(f"{mode:7}{rate:10.0f} msg/s{cpu:10.2f} CPU ms/msg")
    if "none" in summary:
        base_rate, base_cpu = summary["none"]
        for mode in modes:
            if mode != "none":
                rate, cpu = summary[mode]
                print(f"{mode} / none: {rate / base_rate:.3f}x the rate, {cpu / base_cpu:.3f}x the CPU per message")
        if hook_us is not None:
            share = hook_us / (base_cpu * 1000)
            print(f"no-op hook work per message / CPU per message without a policy: {share:.2%}")
        # Per round, against the same round's `none`: the noise between rounds cancels out.
        for mode in modes:
            if mode != "none":
                ratios = [r / b for (r, _), (b, _) in zip(results[mode], results["none"], strict=True)]
                print(f"{mode} / none per round: {', '.join(f'{x:.3f}' for x in ratios)}; median {median(ratios):.3f}")


if __name__ == "__main__":
    main()
