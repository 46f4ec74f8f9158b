"""Shaping that reacts, through real nodes: two nodes of two workers each share a Redis and
deliver to one sink, whose site has a `[[reaction]]` rule `421 4.7.0 ... rate limited ->
suspend 3s`. The sink starts answering `421 4.7.0 rate limited` to node A's mail only; every
node (B too, which never got a 421) stops delivering to the site within a second, delivery
resumes when the rule's time is over, and every message arrives exactly once. The effect is
in the API and /metrics of the other node, and in node A's log.

And on one node without Redis: `pigeon shaping status` lists an effect, a `bounce` reaction
bounces the site's mail, and a `limit` one holds the site to its lowered connection limit."""

from __future__ import annotations

import itertools
import json
import re
import signal
import smtplib
import subprocess
import threading
import time
from collections import Counter
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess, to_toml
from tests.support.services import RedisServer
from tests.support.sinks import ScriptedSink, TurnAwaySink, delivery_config, peak_connections, wait_until

PER_NODE = 60
B_MAIL = 2 * PER_NODE
SUSPEND = 3.0
RATE_LIMITED = "421 4.7.0 rate limited"


def _node(root: Path, name: str, sink: ScriptedSink, redis: RedisServer) -> PigeonProcess:
    sections: dict[str, Any] = delivery_config(sink.endpoint, helo_name=f"{name}.pigeon.test", max_message_rate="30/s")
    return PigeonProcess(
        root / name,
        node={"name": name, "workers": 2},
        redis={"url": redis.url, "timeout": "1s"},
        log={"level": "info"},
        reaction=[
            {
                "id": "sink-rate-limited",
                "match": r"^421 4\.7\.0 .*rate limited",
                "site": "127.0.0.1:*",
                "action": "suspend",
                "duration": f"{SUSPEND:g}s",
            }
        ],
        **sections,
    )


def _inject(node: PigeonProcess, name: str, count: int, connections: int = 4) -> None:
    """`count` messages to `<name>-<i>@dest.test`, over a few connections (so both workers take some)."""

    def send(numbers: range) -> None:
        with smtplib.SMTP("127.0.0.1", node.smtp_port, timeout=30) as client:
            for i in numbers:
                message = EmailMessage()
                message["From"] = f"{name}@origin.test"
                message["To"] = f"{name}-{i}@dest.test"
                message["Subject"] = f"{name} {i}"
                message["Message-ID"] = f"<{name}-{i}@origin.test>"
                message.set_content("hello\n")
                client.send_message(message)

    threads = [threading.Thread(target=send, args=(range(k, count, connections),)) for k in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.mark.timeout(180)
def test_a_421_seen_by_one_node_suspends_the_site_on_every_node_until_the_rule_says(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    refusing = threading.Event()
    refused: list[float] = []  # when the sink answered 421 (time.monotonic(), as its arrivals)

    def rcpt_reply(address: str) -> str | None:
        if not refusing.is_set() or not address.startswith("a-"):
            return None
        now = time.monotonic()
        if refused and now > refused[0] + 0.3:
            return None  # a short burst of 421s: what follows the suspension goes through
        refused.append(now)
        return RATE_LIMITED

    with ScriptedSink() as sink:
        sink.rcpt_reply = rcpt_reply
        with _node(tmp_path, "a", sink, redis_server) as a, _node(tmp_path, "b", sink, redis_server) as b:
            # Both nodes deliver, then the sink starts refusing A's mail. A's mail goes in once B
            # is seen delivering: sent together, a loaded machine once had A deliver all of its
            # mail (2 s at 30/s) before B's first, and no A mail was left to refuse. B has twice
            # as much, so that it still has some once the suspension is over.
            _inject(b, "b", B_MAIL)
            wait_until(lambda: "b.pigeon.test" in {x.helo for x in sink.arrivals}, timeout=20)
            _inject(a, "a", PER_NODE)
            wait_until(lambda: "a.pigeon.test" in {x.helo for x in sink.arrivals}, timeout=20)
            refusing.set()
            wait_until(lambda: refused, timeout=10)
            first = refused[0]

            # While it lives: the other node lists the effect (API, CLI, metrics).
            token = b.local_token
            answer = wait_until(lambda: _listed(b, token), timeout=5)
            listed_after = time.monotonic() - first
            assert answer["mode"] == "cluster", answer
            [effect] = answer["effects"]
            assert (effect["rule"], effect["action"], effect["key"], effect["node"]) == (
                "sink-rate-limited", "suspend", f"site:{sink.endpoint}", "a")  # fmt: skip
            assert effect["reply"].startswith(RATE_LIMITED)
            assert effect["expires_at"] - effect["created"] == pytest.approx(SUSPEND)
            # Every worker of every node knows it (each worker's gauge).
            wait_until(lambda: _knowing(a) == _knowing(b) == 2, timeout=5)
            everywhere_after = time.monotonic() - first

            # Every message arrives, exactly once.
            sink.wait_for(PER_NODE + B_MAIL, timeout=60)
            time.sleep(0.5)  # (nothing more should come)
            a.wait_records("ShapingEffect", 2)  # created and expired
            b.wait_records("ShapingEffect", 2)  # learned and expired
            records_a, records_b = a.records("ShapingEffect"), b.records("ShapingEffect")

    counted = Counter((m.email["Message-ID"], tuple(m.recipients)) for m in sink.received)
    assert len(counted) == PER_NODE + B_MAIL and set(counted.values()) == {1}, counted.most_common(3)

    by_node = {"a": [], "b": []}  # type: dict[str, list[float]]
    for arrival in sink.arrivals:
        by_node[arrival.helo.split(".")[0]].append(arrival.at - first)
    for node, times in by_node.items():
        assert any(t < 0 for t in times), f"{node} delivered nothing before the 421"
        # Within a second of the first 421, every node stops ...
        stalled = [round(t, 3) for t in times if 1.0 < t < SUSPEND]
        assert not stalled, f"{node} delivered {len(stalled)} messages while the site was suspended: {stalled}"
        # ... and resumes once the rule's time is over (not much later).
        after = [t for t in times if t >= SUSPEND]
        assert after, f"{node} never resumed"
        assert min(after) < SUSPEND + 1.5, f"{node} resumed {min(after):.2f}s after the 421"

    created, expired = (r for r in records_a if r["event"] == "created"), (
        r for r in records_a if r["event"] == "expired")  # fmt: skip
    [created_record], [expired_record] = list(created), list(expired)
    assert created_record["rule"] == "sink-rate-limited" and created_record["scope"] == "cluster"
    assert created_record["key"] == f"site:{sink.endpoint}" and created_record["node"] == "a"
    assert expired_record["effect"] == created_record["effect"] == effect["id"]
    # Node b's log says so too, once (by the first of its workers to learn of it), with its origin.
    assert [(r["event"], r["effect"], r["origin"]) for r in records_b] == [
        ("learned", effect["id"], "a"),
        ("expired", effect["id"], "a"),
    ]
    assert listed_after < 1.0, f"node b listed the effect {listed_after:.2f}s after the 421"
    assert everywhere_after < 1.0, f"every worker knew the effect {everywhere_after:.2f}s after the 421"


def _knowing(node: PigeonProcess) -> int:
    """How many of `node`'s workers know a live suspension (/metrics)."""
    _, metrics = node.http_get("/metrics")
    return len(re.findall(rb'pigeon_shaping_effects\{action="suspend",worker="\d+"\} 1', metrics))


def _listed(node: PigeonProcess, token: str) -> Any:
    """The effects answer of `node`'s API once it lists an effect (else None)."""
    status, answer = _get(node, "/api/v1/shaping/effects", token)
    assert status == 200, answer
    return answer if answer["effects"] else None


def _get(node: PigeonProcess, path: str, token: str) -> tuple[int, Any]:
    return node.http_call("GET", path, token=token)


def _single(root: Path, sink: ScriptedSink | TurnAwaySink, **reaction: Any) -> PigeonProcess:
    rule = {"id": "sink-says-so", "match": r"^421 4\.7\.0 .*rate limited", "duration": "1m", **reaction}
    return PigeonProcess(root, log={"level": "info"}, reaction=[rule], **delivery_config(sink.endpoint))


def _cli(node: PigeonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    command = [*args, "-c", str(node.config_path)]
    return zygote.run(command, text=True, timeout=60, check=True)


def _status(node: PigeonProcess, *options: str) -> subprocess.CompletedProcess[str]:
    command = ["shaping", "status", "-c", str(node.config_path), *options]
    return zygote.run(command, text=True, timeout=60, check=False)


def test_shaping_status_lists_a_live_effect_and_its_records_are_written(tmp_path: Path) -> None:
    with ScriptedSink() as sink:
        sink.rcpt_reply = lambda address: RATE_LIMITED if address.startswith("first") else None
        with _single(tmp_path / "node", sink, action="suspend") as node:
            _inject(node, "first", 1, connections=1)
            [record] = node.wait_records("ShapingEffect")
            _inject(node, "later", 3, connections=1)
            shown = _status(node)
            listed = json.loads(_status(node, "--json").stdout)
            summary = _cli(node, "queue", "summary")
            ready = json.loads(_cli(node, "queue", "summary", "--json").stdout)["ready"]
            time.sleep(0.5)
            held = list(sink.received)
    assert shown.returncode == 0, shown.stderr
    assert "this node's (no [redis])" in shown.stdout
    assert "sink-says-so" in shown.stdout and f"site:{sink.endpoint}" in shown.stdout
    assert "suspend" in shown.stdout and re.search(r" in (1m00s|[1-5]?[0-9]s) ", shown.stdout), shown.stdout
    assert listed["mode"] == "node" and [e["id"] for e in listed["effects"]] == [record["effect"]]
    assert (record["event"], record["scope"], record["action"]) == ("created", "node", "suspend")
    assert held == []  # the later mail waits while the effect lives
    # and the queue it waits in says why
    [row] = [row for row in ready if row["site"] == sink.endpoint]
    assert row["queued"] == 3 and [e["id"] for e in row["effects"]] == [record["effect"]], ready
    assert re.search(r"suspend until \S+ \S+ UTC \(rule sink-says-so\)", summary.stdout), summary.stdout


def test_an_operator_ends_a_suspension_early_and_the_mail_it_held_goes_at_once(tmp_path: Path) -> None:
    with ScriptedSink() as sink:
        refused: list[str] = []

        def once(address: str) -> str | None:  # the site is fine again after one refusal
            if address.startswith("first") and not refused:
                refused.append(address)
                return RATE_LIMITED
            return None

        sink.rcpt_reply = once
        with _single(tmp_path / "node", sink, action="suspend") as node:  # for a minute
            _inject(node, "first", 1, connections=1)
            [created] = node.wait_records("ShapingEffect")
            _inject(node, "later", 3, connections=1)
            time.sleep(0.5)
            assert sink.received == []  # held
            ended = _cli(node, "shaping", "end", created["effect"])
            started = time.monotonic()
            # The 3 it held, and the one whose reply started it (deferred to the effect's end),
            # now rather than in a minute.
            sink.wait_for(4, timeout=15)
            took = time.monotonic() - started
            records = node.wait_records("ShapingEffect", 2)
            listed = json.loads(_status(node, "--json").stdout)
            again = zygote.run(
                ["shaping", "end", created["effect"], "-c", str(node.config_path)],
                text=True,
                timeout=60,
                check=False,
            )
    assert f"ended suspend site:{sink.endpoint} (effect {created['effect']}, rule sink-says-so)" in ended.stdout
    assert took < 10
    assert [(r["event"], r["effect"]) for r in records] == [(e, created["effect"]) for e in ("created", "ended")]
    assert records[1]["ended_by"]  # the operator's token
    assert listed["effects"] == []
    assert again.returncode != 0 and "no live shaping effect" in again.stderr + again.stdout
    assert sorted(Counter(r.recipients[0].split("-")[0] for r in sink.received).items()) == [("first", 1), ("later", 3)]


@pytest.mark.parametrize(("refused", "held"), [("dest.test", "own.test"), ("own.test", "dest.test")])
def test_a_source_scoped_suspension_holds_every_queue_from_that_source_to_the_site(
    tmp_path: Path, refused: str, held: str
) -> None:
    # own.test has a [[shaping]] block, so a ready queue of its own (default->own.test@site):
    # a provider telling the sending address to stop is about that address, whichever of its
    # queues to the site heard it; it used to hold only that one queue.
    with ScriptedSink() as sink:
        sink.rcpt_reply = lambda address: RATE_LIMITED if address.startswith("first") else None
        rule = {
            "id": "sink-says-so",
            "match": r"^421 4\.7\.0 .*rate limited",
            "duration": "1m",
            "scope": "source",
            "action": "suspend",
        }
        sections = delivery_config(sink.endpoint)
        shaping = [{"domain": "own.test", "idle_timeout": "3s"}]
        with PigeonProcess(
            tmp_path / "node", log={"level": "info"}, reaction=[rule], shaping=shaping, **sections
        ) as node:
            with smtplib.SMTP("127.0.0.1", node.smtp_port, timeout=30) as client:
                client.sendmail("a@origin.test", [f"first@{refused}"], b"Subject: first\r\n\r\nhi\r\n")
                [record] = node.wait_records("ShapingEffect")
                for i in range(3):
                    client.sendmail("a@origin.test", [f"later-{i}@{held}"], b"Subject: later\r\n\r\nhi\r\n")
            wait_until(lambda: len(node.records("Reception")) == 4)
            time.sleep(1.5)
            ready = json.loads(_cli(node, "queue", "summary", "--json").stdout)["ready"]
    assert record["key"] == f"path:default->{sink.endpoint}", record
    assert sink.received == []  # the 3 later messages wait with the first, on the other queue
    waiting = {row["path"]: ([e["id"] for e in row["effects"]], row["queued"]) for row in ready}
    # (the first waits for the effect's end on the retry schedule, not in a ready queue)
    assert sorted(queued for _, queued in waiting.values()) == [0, 3], ready
    assert all(effects == [record["effect"]] for effects, _ in waiting.values()), ready


def test_a_bounce_reaction_bounces_the_sites_mail(tmp_path: Path) -> None:
    with ScriptedSink() as sink:
        sink.rcpt_reply = lambda address: RATE_LIMITED if address.startswith("first") else None
        with _single(tmp_path / "node", sink, action="bounce") as node:
            _inject(node, "first", 1, connections=1)
            node.wait_records("ShapingEffect")
            _inject(node, "later", 3, connections=1)
            bounces = node.wait_records("Bounce", 4)
    assert sink.received == []
    assert {b["response"]["code"] for b in bounces} == {554}
    assert all("sink-says-so" in b["response"]["text"] for b in bounces)


def test_a_limit_reaction_holds_the_site_to_the_lowered_connection_limit(tmp_path: Path) -> None:
    with ScriptedSink(slow=0.2) as sink:
        sink.rcpt_reply = lambda address: RATE_LIMITED if address.startswith("first") else None
        with _single(tmp_path / "node", sink, action="limit", connection_limit=1) as node:
            _inject(node, "first", 1, connections=1)
            node.wait_records("ShapingEffect")
            shown = _status(node)
            since = time.monotonic()
            _inject(node, "slow", 12, connections=4)  # (slow@: each RCPT takes 0.2 s)
            sink.wait_for(12, timeout=30)
    assert peak_connections(sink.connections, since=since) == 1
    # The lowered limit is wider than "action": the columns after it still line up.
    heading, row = shown.stdout.splitlines()[1:3]
    assert "limit 1 conn" in row, shown.stdout
    assert row.index(f"site:{sink.endpoint}") == heading.index("key"), shown.stdout
    assert row.index("sink-says-so") == heading.index("rule"), shown.stdout


# Gmail's answer under too many connections, which it gives as the greeting or to EHLO.
GMAIL_421 = (
    "421-4.7.0 Try again later, closing connection. (EHLO)\r\n"
    "421-4.7.0  For more information, go to\r\n"
    "421 4.7.0  https://support.google.com/a/answer/3221692 a1-20020a.8 - gsmtp"
)


@pytest.mark.parametrize("phase", ["greeting", "ehlo"])
def test_a_421_as_the_greeting_or_to_ehlo_is_the_logged_response_and_starts_a_reaction(
    tmp_path: Path, phase: str
) -> None:
    # Found from outside: the greeting's 421 was logged inside "451 4.4.1 ... greeted with:",
    # and EHLO's was taken for a refused EHLO (HELO, then "451 4.4.2 ... closed the
    # connection"), so no `^421` rule could ever match either.
    with (
        TurnAwaySink(**{phase: GMAIL_421}) as sink,
        _single(tmp_path / "node", sink, action="suspend", match=r"^421 4\.7\.0") as node,
    ):
        _inject(node, "first", 1, connections=1)
        [created] = node.wait_records("ShapingEffect")
        [failure] = node.wait_records("TransientFailure")
        listed = json.loads(_status(node, "--json").stdout)
        status, effects = _get(node, "/api/v1/shaping/effects", node.local_token)
        status_queues, queues = _get(node, "/api/v1/queues", node.local_token)
    server_words = "421 4.7.0 Try again later, closing connection. (EHLO)"
    response = failure["response"]
    assert (response["code"], response["enhanced"]) == (421, "4.7.0"), response
    assert response["text"].startswith("Try again later, closing connection. (EHLO)"), response
    where = "greeting of [127.0.0.1]" if phase == "greeting" else "answer of [127.0.0.1]"
    assert response["text"].endswith(f" - gsmtp ({where}:{sink.port}{' to EHLO' if phase == 'ehlo' else ''})")
    assert (created["event"], created["rule"], created["action"]) == ("created", "sink-says-so", "suspend")
    assert created["reply"].startswith(server_words)
    [effect] = listed["effects"]
    assert (effect["rule"], effect["key"]) == ("sink-says-so", f"site:{sink.endpoint}")
    assert effect["reply"].startswith(server_words)
    assert status == 200 and [e["id"] for e in effects["effects"]] == [effect["id"]]
    # A host answered: the site is not down (only a site where no host takes a connection is).
    assert status_queues == 200
    [row] = [row for row in queues["ready"] if row["site"] == sink.endpoint]
    assert not row.get("down"), row
    assert not [line for line in sink.received if line.upper().startswith("HELO")]  # no HELO after the 421


def test_a_connection_limit_lowered_by_a_reload_holds_across_the_workers(tmp_path: Path) -> None:
    """Found from outside: lowered from 4 to 1 by a reload (or a `limit` reaction) on a node of
    two workers, each worker ended only what was over the limit in itself: one connection of
    each went on until its mail ran out. The node's workers share the count of those ending."""
    with ScriptedSink(slow=0.3) as sink:  # (each RCPT takes 0.3 s)
        sections = delivery_config(sink.endpoint, connection_limit=4, idle_timeout="5s")
        node = PigeonProcess(tmp_path / "node", node={"workers": 2}, log={"level": "info"}, **sections)
        with node:
            _inject(node, "slow", 48, connections=8)  # (both workers take some: 8 client connections)
            wait_until(lambda: peak_connections(sink.connections) >= 3, timeout=30)
            node.config["delivery"]["connection_limit"] = 1
            node.config_path.write_text(to_toml(node.config))
            assert node.process is not None
            node.process.send_signal(signal.SIGHUP)
            wait_until(lambda: node.stderr().count("reloaded:") >= 2, timeout=10)
            since = time.monotonic() + 1.0  # (a message under way finishes: 0.3 s)
            sink.wait_for(48, timeout=60)
            delivered = node.wait_records("Delivery", 48, timeout=30)
    assert len({d["recipient"] for d in delivered}) == 48
    assert peak_connections(sink.connections, since=since) == 1  # (not 0: mail was still going out)


@pytest.mark.timeout(150)
def test_with_a_limit_of_one_two_workers_backlogs_take_turns(tmp_path: Path) -> None:
    """Found from outside: with connection_limit = 1 on a node of two workers, one worker's
    mail made no delivery until the other's shard drained (under steady traffic, never). A
    connection that has had its turn (`TURN`, 10 s) while the other worker waits makes room."""
    from pigeon.shaping.throttles import TURN

    with ScriptedSink(slow=0.1) as sink:  # (each RCPT takes 0.1 s: 360 messages, 36 s or more)
        sections = delivery_config(sink.endpoint, connection_limit=1)
        node = PigeonProcess(tmp_path / "node", node={"workers": 2}, log={"level": "info"}, **sections)
        with node:
            # Over 36 client connections, so that each worker takes a backlog of over TURN.
            _inject(node, "slow", 360, connections=36)
            delivered = node.wait_records("Delivery", 360, timeout=120)
    assert peak_connections(sink.connections) == 1
    ordered = sorted(delivered, key=lambda r: r["timestamp"])
    shards = [int(record["id"], 16) & 63 for record in ordered]
    assert len(set(shards)) == 2, shards
    start = ordered[0]["timestamp"]
    waited = {shard: next(r["timestamp"] for r, s in zip(ordered, shards, strict=True) if s == shard) - start
              for shard in set(shards)}  # fmt: skip
    assert max(waited.values()) < TURN + 4, f"a worker's mail waited for the other's turn to end: {waited}"
    runs = 1 + sum(1 for before, after in itertools.pairwise(shards) if before != after)
    # Turns are taken when the worker that went first had more than a turn's worth of mail (0.1 s
    # a message). The kernel spreads the 36 connections between the workers as it will: one
    # given few of them (a CI run: all its mail within one turn) needs no second turn.
    first_share = shards.count(shards[0]) * 0.1
    if first_share > TURN + 2:
        assert runs >= 3, f"each worker's mail went in one run ({runs} runs, {first_share:.0f}s of mail first)"


@pytest.mark.slow  # (about 110 s; tests/integration/test_throttles_redis.py has the line's rules)
@pytest.mark.timeout(240)
def test_under_a_cluster_limit_of_one_a_slot_made_room_for_goes_to_a_waiter_not_the_yielders_sibling(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Found from outside: two nodes under a cluster limit of 1, each worker with a backlog: a
    slot a connection made room for (its turn over while another node waited) usually went to
    the other worker of the same node, which had not waited, asking at once, before the other
    node's waiter (asking every 0.1 s): one worker's mail waited 54 s while the turn is 10 s.
    Here node A has two workers and node B one, three backlogs in turn: none waits more than
    the other two's turns (and the changes between them)."""
    from pigeon.shaping.throttles import TURN

    with ScriptedSink(slow=0.2) as sink:  # (each RCPT takes 0.2 s: about 5 messages a second)
        sections = delivery_config(sink.endpoint, connection_limit=1)
        shared: dict[str, Any] = {"redis": {"url": redis_server.url, "timeout": "1s"}, "log": {"level": "info"}}
        a = PigeonProcess(tmp_path / "a", node={"name": "a", "workers": 2}, **shared, **sections)
        b = PigeonProcess(tmp_path / "b", node={"name": "b", "workers": 1}, **shared, **sections)
        with a, b:
            # Over 3 turns of mail for each of the three workers (A's over many client
            # connections, so that both of its workers take some).
            injecting = threading.Thread(target=_inject, args=(a, "slow-a", 320), kwargs={"connections": 32})
            injecting.start()
            _inject(b, "slow-b", 160, connections=4)
            injecting.join()
            delivered = {name: node.wait_records("Delivery", count, timeout=200)
                         for name, node, count in (("a", a, 320), ("b", b, 160))}  # fmt: skip
    assert peak_connections(sink.connections) == 1
    times: dict[tuple[str, int], list[float]] = {}
    for name, records in delivered.items():
        for record in records:
            times.setdefault((name, int(record["id"], 16) & 63), []).append(record["timestamp"])
    assert len(times) == 3, sorted(times)
    start = min(min(each) for each in times.values())
    waits = {party: max(b - a for a, b in itertools.pairwise([start, *sorted(each)])) for party, each in times.items()}
    assert max(waits.values()) < 2 * TURN + 6, f"a worker's mail waited past the other two's turns: {waits}"
