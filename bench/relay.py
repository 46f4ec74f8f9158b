"""End-to-end relaying: smtp-source -> MTA -> smtp-sink, Pigeon against Postfix.

    sudo .venv/bin/python bench/relay.py                 # as root (it runs a private Postfix)

For each contender, alternately for `--rounds` rounds, it prints the median of:

* end-to-end messages per second: from smtp-source's start until smtp-sink has taken the
  last message (`smtp-sink -M`), fsync on in both MTAs;
* CPU milliseconds per message of the MTA's process tree.

A contender with no MTA (smtp-source straight into smtp-sink) runs too: the harness's own cost
and the rate no MTA between them can pass on this machine, printed as a ratio to Postfix's (at
50 KiB on 2 CPUs it is about 3 to 4 times Postfix's rate: every message still crosses both
programs and the kernel twice).

`--drain N` also measures how fast each MTA empties a backlog of N queued messages once the
sink comes up (`--rounds 0 --drain 100000` measures only that).

`--baseline-src DIR` adds each Pigeon contender again, run from another source tree (the `src`
of a checkout of the commit before a change), and prints the change's ratio against it:

    git worktree add /tmp/before HEAD~1
    sudo .venv/bin/python bench/relay.py --baseline-src /tmp/before/src

Realistic mode (`--realistic`): mail that looks like real traffic, delivered by MX.

    sudo .venv/bin/python bench/relay.py --realistic [--messages 10000] [--profile /tmp/pigeon.raw]

10,000 messages (median 20 KiB, a tail to 500 KiB, 1 to 5 recipients each) for 1,000 domains
whose MX records point at a few hundred host names on 200 addresses 127.0.0.x. A DNS server
of the bench's (on 127.0.0.53:53) serves the zone; a sink on port 25 of each address answers
250, or 450 once (10% of recipients, accepted when retried), or 550 (2%: the MTA must send a
DSN to the sender, whose domain's MX is a sink counting bounces). See world.py and traffic.py.
Pigeon asks that server through `[dns] nameservers`; Postfix (`smtp_host_lookup = dns`) runs in
a mount namespace of its own whose /etc/resolv.conf names it, so neither asks anyone else, and
every address they are given is on loopback (`--dns-delay S`: the first query for each name
waits S seconds, as a caching resolver's recursion would). Both back off 1 to 2 s after a
4xx, but Postfix also tries a recipient refused with a 4xx at the domain's next MX host in the
same delivery, at once (the popular domains have two; Pigeon does with `[delivery]
try_next_mx`, off by default): each run prints how long after its 450 each deferred recipient
was tried again.
Our injector submits the mail over 8 sessions (PIPELINING). For each run, then as medians
and ratios:

* the time until everything is settled: every accepted recipient delivered and every refused
  one named in a DSN, from the first message submitted; and the time the MTA took to accept
  them all (it relays meanwhile);
* messages per second (messages / settle time), CPU milliseconds per message of the MTA's
  process tree;
* lost and duplicate deliveries (it fails, exit status 1, if any recipient is lost or given
  another message), DSNs, messages left in the queue, connections and DNS queries, and what
  the MTA's own logs say went wrong besides the sinks' 450s.

`--profile FILE` (either mode) adds one run of Pigeon under py-spy (samples holding the GIL, raw format to
FILE; not counted in the medians) and prints the worker's functions by own time.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import uvloop
from harness import (
    SMTP_SOURCE,
    Mta,
    Pigeon,
    Postfix,
    free_port,
    machine_busy_seconds,
    median,
    require,
    smtp_source,
    timed_relay,
    tree_cpu_seconds,
    warm_up,
    workdir,
)
from harness import (
    smtp_sink as sink,
)
from traffic import Bodies, Message, inject, workload
from world import DNS_ADDRESS, REFUSE, World, build_zone, fate

from pigeon.logs.reader import read_lines


def pigeon(path: Path, workers: str, sink_port: int, source: Path | None = None) -> Pigeon:
    return Pigeon(
        path,
        workers if workers == "auto" else int(workers),
        source=source,
        delivery={"enabled": True, "retry_interval": "1s", "max_retry_interval": "2s", "connection_limit": 32},
        route=[{"domain": "*", "next_hop": f"127.0.0.1:{sink_port}", "tls": "disabled"}],
    )


BASELINE = " (baseline)"


def start(kind: str, path: Path, sink_port: int, baseline: Path | None) -> Mta:
    if kind == "postfix":
        return Postfix(path, relay_port=sink_port, defer=False)
    workers = kind.removesuffix(BASELINE).split(":", 1)[1]
    return pigeon(path, workers, sink_port, baseline if kind.endswith(BASELINE) else None)


NO_MTA = "no MTA"


def one_run(kind: str, args: argparse.Namespace, profile: bool = False) -> tuple[float, float, float, float]:
    """(messages a second, the MTA's CPU ms a message, the whole machine's busy and idle CPU ms a
    message): the last two tell whether the run was bound by CPU or by waiting."""
    sink_port = free_port()
    if kind == NO_MTA:
        # smtp-source straight into smtp-sink: what the harness alone costs and the rate no MTA
        # between them can pass on this machine (each message still crosses both once).
        measured = sink(sink_port, args.messages)
        busy, idle = machine_busy_seconds()
        started = time.perf_counter()
        load = ["-s", str(args.sessions), "-l", str(args.size), "-m", str(args.messages)]
        # The sink exits on taking the last message, before its 250: smtp-source's last
        # session then fails, which is the end we wait for.
        command = [SMTP_SOURCE, *load, "-f", "a@src.test", "-t", "r@sink.test", f"127.0.0.1:{sink_port}"]
        subprocess.run(command, capture_output=True, check=False)
        measured.wait(600)
        rate = args.messages / (time.perf_counter() - started)
        busy_after, idle_after = machine_busy_seconds()
        per_message = 1000 / args.messages
        return rate, 0.0, (busy_after - busy) * per_message, (idle_after - idle) * per_message
    with workdir(f"relay-{kind.replace(':', '-').replace(' ', '')}-") as path:
        warm = sink(sink_port, 200)
        mta = start(kind, path, sink_port, args.baseline_src)
        try:
            warm_up(mta.port, warm, args.size)
            spy = Profile(mta, args.profile) if profile else None
            try:
                busy, idle = machine_busy_seconds()
                rate, cpu = timed_relay(mta.port, mta.root_pid(), sink_port, args.size, args.sessions, args.messages)
                busy_after, idle_after = machine_busy_seconds()
                per_message = 1000 / args.messages
                return rate, cpu, (busy_after - busy) * per_message, (idle_after - idle) * per_message
            finally:
                if spy is not None:
                    spy.stop()
        finally:
            mta.stop()


def drain(args: argparse.Namespace) -> None:
    """A backlog of `args.drain` messages waits in the MTA's queue; the sink comes up: how fast
    does it empty? Pigeon accepts with delivery off, then restarts with it on (the timer runs
    from that restart, start-up included); Postfix accepts with its smtp transport deferred,
    then is reloaded without the deferral and flushed."""
    results = {}
    for kind in ("postfix", "pigeon:1"):
        sink_port = free_port()
        with workdir(f"drain-{kind.replace(':', '-')}-") as path:
            load = ["-d", "-s", "20", "-l", str(args.size), "-m", str(args.drain)]
            load += ["-f", "a@src.test", "-t", "r@sink.test"]
            if kind == "postfix":
                mta: Mta = Postfix(path, relay_port=sink_port, defer=True)
                smtp_source(mta.port, *load)
                measured = sink(sink_port, args.drain)
                cpu_before, started = tree_cpu_seconds(mta.root_pid()), time.perf_counter()
                assert isinstance(mta, Postfix)
                mta.release()
            else:
                accepting = Pigeon(path, 1, delivery={"enabled": False})
                smtp_source(accepting.port, *load)
                accepting.stop()
                measured = sink(sink_port, args.drain)
                started = time.perf_counter()
                mta = pigeon(path, "1", sink_port)
                cpu_before = 0.0  # a new process: all its CPU is the drain's
            try:
                measured.wait(3600)
                elapsed = time.perf_counter() - started
                cpu = tree_cpu_seconds(mta.root_pid()) - cpu_before
            finally:
                mta.stop()
        results[kind] = args.drain / elapsed
        print(f"drain {kind:9} {args.drain} messages in {elapsed:6.1f}s = {results[kind]:6.0f} msg/s, "
              f"{cpu * 1000 / args.drain:.2f} CPU ms/msg", flush=True)  # fmt: skip
    print(f"drain pigeon / postfix: {results['pigeon:1'] / results['postfix']:.2f}x")


# --- realistic mode ---------------------------------------------------------------------------
@dataclass
class Settled:
    messages: int
    injected: float  # seconds until the MTA had accepted the last message
    settled: float  # seconds until the sinks had every delivery and bounce, or the timeout
    cpu: float  # CPU seconds of the MTA's process tree meanwhile
    lost: list[str]
    unexpected: list[str]  # delivered, but refused or never sent
    missing_bounces: list[str]
    wrong_bounces: list[str]
    failures: list[str]  # messages the MTA did not accept
    left: int  # still in the MTA's queue once settled
    world: dict[str, Any]
    notes: list[str]  # what the MTA's logs say went wrong, besides the sinks' own 4xx and 5xx
    others: float  # cores that other processes (not the MTA, the sinks, nor the injector) kept busy
    ours: float  # CPU seconds of the injector and the world (DNS server and sinks)
    data_to_reply: list[float]  # the injector's wait from a message's data to its 250

    @property
    def rate(self) -> float:
        return self.messages / self.settled

    @property
    def cpu_ms(self) -> float:
        return self.cpu * 1000 / self.messages

    @property
    def broken(self) -> bool:
        return bool(self.lost or self.unexpected or self.missing_bounces or self.failures or self.world["mismatched"])


def start_realistic(kind: str, path: Path, baseline: Path | None) -> Mta:
    """Both MTAs deliver by MX through the bench's DNS server, and retry every second or two."""
    if kind == "postfix":
        # qmgr takes a deferred message whose retry time is up to 1 s ahead as due, so a 2 s
        # backoff retries after 1 to 2 s, like Pigeon's 1 s and its jitter. A 1 s backoff let
        # qmgr take a message back in the second it was deferred, find its queue file still
        # locked by the delivery agent, and put it off 60 s, to its next wakeup (300 s).
        backoff = {"minimal_backoff_time": "2s", "maximal_backoff_time": "3s", "queue_run_delay": "1s"}
        return Postfix(path, defer=False, nameserver=DNS_ADDRESS, settings=backoff)
    workers = kind.removesuffix(BASELINE).split(":", 1)[1]
    return Pigeon(
        path,
        workers if workers == "auto" else int(workers),
        source=baseline if kind.endswith(BASELINE) else None,
        delivery={"enabled": True, "retry_interval": "1s", "max_retry_interval": "2s"},
        dns={"nameservers": [f"{DNS_ADDRESS}:53"], "timeout": "2s"},
    )


def realistic_run(kind: str, args: argparse.Namespace, mail: list[Message], bodies: Bodies, profile: bool) -> Settled:
    world = World(args.domains, args.dns_delay)
    try:
        with workdir(f"real-{kind.replace(':', '-').replace(' ', '')}-") as path:
            mta = start_realistic(kind, path, args.baseline_src)
            try:
                spy = Profile(mta, args.profile) if profile else None
                cpu_before, started = tree_cpu_seconds(mta.root_pid()), time.perf_counter()
                machine_before, ours_before = _machine_busy(), _own_cpu() + tree_cpu_seconds(world.process.pid)
                done = uvloop.run(inject(mta.port, mail, bodies, args.sessions))
                injected = time.perf_counter() - started
                expected = {r for m in done.accepted for r in m.recipients if fate(r) != REFUSE}
                refused = {r for m in done.accepted for r in m.recipients if fate(r) == REFUSE}
                deadline = started + args.settle_timeout
                while time.perf_counter() < deadline:
                    counts = world.ask()
                    if counts["delivered"] >= len(expected) and counts["bounced"] >= len(refused):
                        break
                    time.sleep(0.1)
                settled = time.perf_counter() - started
                cpu = tree_cpu_seconds(mta.root_pid()) - cpu_before
                ours = _own_cpu() + tree_cpu_seconds(world.process.pid) - ours_before
                others = (_machine_busy() - machine_before - ours - cpu) / settled
                if spy is not None:
                    spy.stop()
                time.sleep(args.grace)  # a duplicate comes late, if it comes
                left = mta.queued()
            finally:
                mta.stop()
            notes = diagnose(kind, path)
        final = world.ask("final")
    finally:
        world.stop()
    delivered, bounced = set(final.pop("delivered_recipients")), set(final.pop("bounced_recipients"))
    return Settled(
        messages=len(done.accepted),
        injected=injected,
        settled=settled,
        cpu=cpu,
        lost=sorted(expected - delivered),
        unexpected=sorted(delivered - expected),
        missing_bounces=sorted(refused - bounced),
        wrong_bounces=sorted(bounced - refused),
        failures=done.failures,
        left=left,
        world=final,
        notes=notes,
        others=others,
        ours=ours,
        data_to_reply=done.data_to_reply,
    )


def _machine_busy() -> float:
    """CPU seconds all processes have spent, since boot."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _common(reasons: collections.Counter[str], label: str, top: int = 5) -> list[str]:
    return [f"{label} x{n}: {reason}" for reason, n in reasons.most_common(top)]


def _shape(text: str) -> str:
    """A log line without what varies between lines alike (numbers, queue ids, addresses)."""
    text = re.sub(r"<[^>]*>", "<...>", text)
    return re.sub(r"\b[0-9A-F]{8,}\b|\d+", "#", text)[:160]


def diagnose(kind: str, path: Path) -> list[str]:
    """Deferrals for other reasons than the sinks' 450 4.2.1, and warnings, from the MTA's logs."""
    deferred: collections.Counter[str] = collections.Counter()
    warnings: collections.Counter[str] = collections.Counter()
    outcomes: collections.Counter[str] = collections.Counter()
    if kind == "postfix":
        for line in (path / "maillog").read_text(errors="replace").splitlines():
            found = re.search(r"status=(\w+) \((.*)\)$", line)
            if found:
                outcomes[found.group(1)] += 1
                if found.group(1) == "deferred" and "4.2.1" not in found.group(2):
                    deferred[_shape(found.group(2))] += 1
            elif re.search(r"\b(warning|error|fatal|panic):", line):
                warnings[_shape(line.split(": ", 1)[-1])] += 1
            elif line.endswith("skipped, still being delivered"):
                # qmgr found the queue file still locked by the agent of the last try: it puts
                # the message off for 60 s, which a retry cadence of a second makes likely.
                warnings["skipped, still being delivered (the next try waits 60 s)"] += 1
    else:
        decoder = msgspec.json.Decoder(dict[str, Any])
        for raw in read_lines(path / "log"):
            record = decoder.decode(raw)
            outcomes[record["type"]] += 1
            response = record.get("response") or {}
            if record["type"] == "TransientFailure" and response.get("enhanced") != "4.2.1":
                deferred[_shape(f"{response.get('code')} {response.get('enhanced')} {response.get('text')}")] += 1
        for line in (path / "stderr.log").read_text(errors="replace").splitlines():
            if re.search(r"\b(WARNING|ERROR|CRITICAL|Traceback)\b", line) and "running as root" not in line:
                warnings[_shape(line)] += 1
    return [
        "outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())),
        *_common(deferred, "deferred"),
        *_common(warnings, "logged"),
    ]


RATE = 200  # py-spy samples per second


class Profile:
    """py-spy on the first worker of a Pigeon node, for one run (it slows the worker down). Only
    samples of a thread holding the GIL: time the worker's Python code runs, not its waits (a
    thread blocked in a queue's get() is often sampled as busy otherwise)."""

    def __init__(self, mta: Mta, output: Path) -> None:
        pids = mta.pids()
        self.output = output
        self.worker = pids[1] if len(pids) > 1 else pids[0]
        spy = require(str(Path(sys.executable).with_name("py-spy")), "py-spy (pip install py-spy)")
        command = [spy, "record", "--pid", str(self.worker), "--gil", "--rate", str(RATE), "--threads"]
        command += ["--format", "raw", "--output", str(output)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # let it attach

    def stop(self) -> None:
        self.process.send_signal(2)  # SIGINT: py-spy writes its file and exits
        self.process.wait(60)


def own_time(raw: Path, top: int = 15) -> str:
    """Functions by own time (the frame a sample was taken in) in a py-spy raw file, as shares of
    all samples, after the share of each thread."""
    own: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        threads[frames[0]] += int(count)
        own[re.sub(r":\d+\)$", ")", frames[-1])] += int(count)
    total = sum(own.values())
    lines = [f"py-spy: {total} samples holding the GIL (~{total / RATE:.0f} s); threads, then functions by own time:"]
    lines += [f"  {n / total:6.1%}  {thread}" for thread, n in threads.most_common(4)]
    lines += [f"  {n / total:6.1%}  {where}" for where, n in own.most_common(top)]
    return "\n".join(lines)


def realistic(args: argparse.Namespace) -> bool:
    """Runs the contenders alternately; prints each run, then medians and ratios. False: mail was lost."""
    zone = build_zone(args.domains)
    mail = workload(args.messages, zone)
    bodies = Bodies()
    pigeons = [f"pigeon:{w.strip()}" for w in args.pigeon_workers.split(",")]
    # (No "no MTA" contender here: mail delivered by MX has no one sink to send it to straight.)
    kinds = ["postfix", *pigeons, *([p + BASELINE for p in pigeons] if args.baseline_src else [])]
    recipients = sum(len(m.recipients) for m in mail)
    size = sum(m.size for m in mail)
    print(f"{len(mail)} messages ({size / 2**20:.0f} MiB), {recipients} recipients in "
          f"{len({r.split('@')[1] for m in mail for r in m.recipients})} domains; "
          f"{sum(fate(r) == 4 for m in mail for r in m.recipients)} deferred once, "
          f"{sum(fate(r) == REFUSE for m in mail for r in m.recipients)} refused", flush=True)  # fmt: skip
    results: dict[str, list[Settled]] = {kind: [] for kind in kinds}
    healthy = True
    for round_no in range(args.rounds):
        for kind in kinds if round_no % 2 == 0 else list(reversed(kinds)):
            run = realistic_run(kind, args, mail, bodies, profile=False)
            results[kind].append(run)
            healthy &= report(f"round {round_no + 1}: {kind}", run)
    if args.profile:
        run = realistic_run(pigeons[0], args, mail, bodies, profile=True)
        healthy &= report(f"profiled: {pigeons[0]}", run)
    if args.rounds:
        summarise(results, args, pigeons)
    if args.profile:
        print()
        print(own_time(args.profile))
    if not healthy:
        print("\n*** FAILED: mail was lost, misdelivered or not accepted (see above) ***")
    return healthy


def summarise(results: dict[str, list[Settled]], args: argparse.Namespace, pigeons: list[str]) -> None:
    kinds = list(results)
    print(f"\nrealistic relay, {args.messages} messages, medians of {args.rounds} rounds:")
    fields = ("settled", "rate", "cpu_ms")
    summary = {k: tuple(median([getattr(r, f) for r in v]) for f in fields) for k, v in results.items()}
    for kind, (settled, rate, cpu) in summary.items():
        print(f"{kind:25} settled in {settled:6.1f}s {rate:8.0f} msg/s {cpu:8.2f} CPU ms/msg")
    _, postfix_rate, postfix_cpu = summary["postfix"]
    for kind in kinds[1:]:
        _, rate, cpu = summary[kind]
        print(f"{kind} / postfix: {rate / postfix_rate:.2f}x the rate, {postfix_cpu / cpu:.2f}x less CPU per message")
    for kind in pigeons if args.baseline_src else []:
        (_, rate, cpu), (_, base_rate, base_cpu) = summary[kind], summary[kind + BASELINE]
        print(f"{kind} / its baseline: {rate / base_rate:.2f}x the rate, {cpu / base_cpu:.2f}x the CPU per message")


def report(label: str, run: Settled) -> bool:
    w = run.world
    state = "settled in" if not (run.lost or run.missing_bounces) else "NOT settled after"
    print(f"{label:28} {state} {run.settled:6.1f}s (accepted all in {run.injected:5.1f}s) "
          f"{run.rate:6.0f} msg/s {run.cpu_ms:6.2f} CPU ms/msg | lost {len(run.lost)}, duplicates "
          f"{w['duplicates']}, bounced {w['bounced']} ({w['bounce_duplicates']} twice) in {w['dsns']} DSNs, "
          f"left {run.left} | {w['connections']} connections, {w['transactions']} transactions, "
          f"{w['dns_queries']} DNS queries", flush=True)  # fmt: skip
    if w["retry_wait"]:
        least, middle, p90, most = w["retry_wait"]
        print(f"    450 to retry: least {least:.1f}s, median {middle:.1f}s, p90 {p90:.1f}s, most {most:.1f}s")
    waits = sorted(run.data_to_reply)
    median_wait, p99_wait = waits[len(waits) // 2] * 1000, waits[len(waits) * 99 // 100] * 1000
    print(f"    data to 250: median {median_wait:.0f} ms, p99 {p99_wait:.0f} ms; injector and sinks "
          f"{run.ours * 1000 / run.messages:.2f} CPU ms/msg; other processes kept {run.others:.1f} of "
          f"{os.cpu_count()} cores busy")  # fmt: skip
    problems = {
        "LOST (not delivered once settled, or by --settle-timeout)": run.lost,
        "delivered though refused or never sent": run.unexpected,
        "no DSN for": run.missing_bounces,
        "DSN for a recipient not refused": run.wrong_bounces,
        "not accepted by the MTA": run.failures,
        "DNS names outside the zone": w["dns_stray"],
    }
    for what, items in problems.items():
        if items:
            print(f"    {what} ({len(items)}): {', '.join(map(str, items[:8]))}{' ...' if len(items) > 8 else ''}")
    for what in ("mismatched", "refused_again", "delayed_notices"):
        if w[what]:
            print(f"    {what}: {w[what]}")
    for note in run.notes:
        print(f"    {note}")
    return not run.broken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--realistic", action="store_true", help="the realistic mode (see above)")
    parser.add_argument("--messages", type=int, default=None, help="default 20000, realistic 10000")
    parser.add_argument("--sessions", type=int, default=None, help="injecting sessions: default 20, realistic 8")
    parser.add_argument("--domains", type=int, default=1000, help="realistic: recipient domains")
    parser.add_argument("--dns-delay", type=float, default=0, help="realistic: seconds a name's first query waits")
    parser.add_argument("--settle-timeout", type=float, default=600, help="realistic: seconds before mail is lost")
    parser.add_argument("--grace", type=float, default=3, help="realistic: seconds to wait for duplicates")
    parser.add_argument("--profile", type=Path, help="one more run, of Pigeon under py-spy (raw output)")
    parser.add_argument("--size", type=int, default=5120)
    parser.add_argument("--rounds", type=int, default=2, help="relay rounds (0: only --drain)")
    parser.add_argument("--pigeon-workers", default="1,2")
    parser.add_argument("--drain", type=int, default=0, help="also measure draining a backlog of this many")
    parser.add_argument("--baseline-src", type=Path, help="also run each Pigeon from this source tree, as a baseline")
    args = parser.parse_args()
    if args.realistic:
        args.messages = args.messages or 10000
        args.sessions = args.sessions or 8
        sys.exit(0 if realistic(args) else 1)
    args.messages = args.messages or 20000
    args.sessions = args.sessions or 20
    require(SMTP_SOURCE, "postfix")
    if args.rounds:
        relay(args)
    if args.drain:
        drain(args)


def relay(args: argparse.Namespace) -> None:
    pigeons = [f"pigeon:{w.strip()}" for w in args.pigeon_workers.split(",")]
    kinds = [NO_MTA, "postfix", *pigeons, *([p + BASELINE for p in pigeons] if args.baseline_src else [])]
    results: dict[str, list[tuple[float, float]]] = {kind: [] for kind in kinds}
    for round_no in range(args.rounds):
        for kind in kinds if round_no % 2 == 0 else list(reversed(kinds)):
            rate, cpu, machine, idle = one_run(kind, args)
            results[kind].append((rate, cpu))
            print(f"round {round_no + 1}: {kind:12} {rate:8.0f} msg/s end to end  {cpu:5.2f} CPU ms/msg"
                  f"  (machine busy {machine:.2f}, idle {idle:.2f})", flush=True)  # fmt: skip
    print(f"\nsmtp-source -s {args.sessions} -l {args.size} -m {args.messages} -> MTA -> smtp-sink, medians:")
    summary = {kind: (median([r for r, _ in v]), median([c for _, c in v])) for kind, v in results.items()}
    for kind, (rate, cpu) in summary.items():
        print(f"{kind:25}{rate:10.0f} msg/s{cpu:10.2f} CPU ms/msg")
    postfix_rate, postfix_cpu = summary["postfix"]
    print(f"{NO_MTA} / postfix: {summary[NO_MTA][0] / postfix_rate:.2f}x the rate: the most any MTA could show here")
    for kind in kinds[2:]:
        rate, cpu = summary[kind]
        print(f"{kind} / postfix: {rate / postfix_rate:.2f}x the rate, {postfix_cpu / cpu:.2f}x less CPU per message")
    for kind in pigeons if args.baseline_src else []:
        (rate, cpu), (base_rate, base_cpu) = summary[kind], summary[kind + BASELINE]
        print(f"{kind} / its baseline: {rate / base_rate:.2f}x the rate, {cpu / base_cpu:.2f}x the CPU per message")
    if args.profile:
        rate, cpu, _, _ = one_run(pigeons[0], args, profile=True)
        print(f"profiled: {pigeons[0]} {rate:.0f} msg/s, {cpu:.2f} CPU ms/msg (under py-spy, not counted)")
        print(own_time(args.profile, top=40))


if __name__ == "__main__":
    main()
