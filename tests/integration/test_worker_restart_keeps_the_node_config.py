"""A worker its supervisor starts again (it crashed, was killed, or hung past `[node]
worker_timeout`) runs the configuration the node runs: the keys a reload leaves for the next
restart as they were when the node started, the reloadable ones as of the last reload. Not the
file as it is on disk by then: the node would run two configurations at once (half the clients
refused relaying, a shard's mail out of sight under another spool path)."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import smtplib
import sqlite3
import ssl
import time
from contextlib import closing
from pathlib import Path

from pigeon.dkim.keys import generate_key, write_key
from pigeon.listener.passwords import set_password
from pigeon.listener.tls import ensure_self_signed
from tests.support.ports import free_port
from tests.support.process import PigeonProcess, to_toml
from tests.support.sinks import ScriptedSink, delivery_config

MESSAGE = b"From: a@example.org\r\nSubject: restart\r\n\r\nhello\r\n"
RELAY_ONLY_ELSEWHERE = "192.0.2.0/24"  # loopback is no relay network with this


def _hangup(pigeon: PigeonProcess, workers: int = 2) -> None:
    """SIGHUP, then wait until every worker has said how its reload went."""
    assert pigeon.process is not None
    before = pigeon.stderr().count("reloaded:")
    pigeon.process.send_signal(signal.SIGHUP)
    pigeon.wait_stderr("reloaded:", count=before + workers)


def _edit(pigeon: PigeonProcess, section: str, **values: object) -> None:
    """The operator's edit of the config file (`pigeon.config` stays the node's start)."""
    config = json.loads(json.dumps(pigeon.config))
    config.setdefault(section, {}).update(values)
    pigeon.config_path.write_text(to_toml(config))


def _kill_worker_1(pigeon: PigeonProcess, index: int = 1) -> None:
    """kill -9 worker 1 (or `index`), and wait until the supervisor has started it again and
    it answers, and for the reload a restarted worker does at once if it takes the node's last one."""
    killed = pigeon.shard_owner(index)
    before = len(re.findall(rf" w{index} INFO \S+: reloaded:", pigeon.stderr()))
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while True:
        status, body = pigeon.http_get("/healthz")
        worker = json.loads(body)["workers"][index]
        if status == 200 and worker["restarts"] == 1 and worker["status"] == "ok":
            break
        assert time.monotonic() < deadline, body
        time.sleep(0.2)
    # Not asserted here: the tests say what a user sees, whether or not that reload came.
    deadline = time.monotonic() + 5
    while len(re.findall(rf" w{index} INFO \S+: reloaded:", pigeon.stderr())) == before and time.monotonic() < deadline:
        time.sleep(0.05)


def _per_shard(spool: Path) -> dict[str, int]:
    counts = {}
    for db in spool.glob("shard-*/spool.db"):
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            counts[db.parent.name] = conn.execute("SELECT count(*) FROM message").fetchone()[0]
    return counts


def _received_by(pigeon: PigeonProcess, worker: int) -> int:
    """How many messages `worker` took, as its own log segments say (compressed once closed)."""
    segments = (pigeon.root / "log").glob(f"*-w{worker}.jsonl*")
    return sum(
        (gzip.decompress(s.read_bytes()) if s.suffix == ".gz" else s.read_bytes()).count(b'"type":"Reception"')
        for s in segments
    )


def _send(pigeon: PigeonProcess, count: int, message: bytes = MESSAGE) -> list[int]:
    """`count` messages, one new connection each (whichever worker takes it): the RCPT replies,
    or for a recipient taken, the reply to the message."""
    replies = []
    for n in range(count):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
            client.ehlo("client.test")
            client.mail("a@src.test")
            code, said = client.rcpt(f"user{n}@dst.test")
            if code == 250:
                code, said = client.data(message)
            replies.append(code)
            assert code == 250 or b"Relay access denied" in said, said
    return replies


BIG = b"From: a@example.org\r\nSubject: big\r\n\r\n" + (b"y" * 76 + b"\r\n") * 1000  # 78 KiB


def test_a_restarted_worker_keeps_the_message_size_the_node_started_with(tmp_path: Path) -> None:
    """`max_message_size` edited and reloaded ("takes effect at the next restart"), then a
    worker killed: every client's message the node took before is still taken, by either
    worker (one would refuse it with 552 if it had read the file)."""
    with PigeonProcess(tmp_path / "node", node={"workers": 2}) as pigeon:
        _edit(pigeon, "smtp", max_message_size="64KiB")
        _hangup(pigeon)
        _kill_worker_1(pigeon)
        replies = _send(pigeon, 20, BIG)
        assert replies == [250] * 20, f"{20 - replies.count(250)} of 20 messages refused"
        shards = _per_shard(pigeon.spool_path)
        assert shards.get("shard-0", 0) > 0 and shards.get("shard-1", 0) > 0, shards  # both workers took some
        said = pigeon.stderr()
    restart_only = "reload: [smtp] max_message_size changed; it takes effect at the next restart"
    assert f"w1 WARNING pigeon.node.node: {restart_only}" in said.split("worker 1 started", 2)[1]  # at the SIGHUP
    # The new w1 says which value it runs (found from outside: "at the next restart", said by
    # a worker that had just restarted, left that unclear).
    kept = (
        "reload: [smtp] max_message_size changed; this worker, started again, keeps the value the node started "
        "with, as the other workers do; it takes effect when the node restarts"
    )
    assert f"w1 WARNING pigeon.node.node: {kept}" in said.split("worker 1 started", 2)[2]


def test_a_restarted_worker_takes_the_relay_networks_the_node_reloaded(tmp_path: Path) -> None:
    """`relay_networks` narrowed and reloaded (a network taken out, at once), then a worker
    killed: the restarted worker, like the other, relays no more for the network taken out."""
    with PigeonProcess(tmp_path / "node", node={"workers": 2}) as pigeon:
        _edit(pigeon, "smtp", relay_networks=[RELAY_ONLY_ELSEWHERE])
        _hangup(pigeon)
        _kill_worker_1(pigeon)
        replies = _send(pigeon, 20)
        assert replies == [550] * 20, f"{replies.count(250)} of 20 loopback clients relayed for"
        assert pigeon.wait_records("Rejection", 20)


def test_a_restarted_worker_keeps_its_shard_and_delivers_its_mail_after_the_spool_path_was_edited(
    tmp_path: Path,
) -> None:
    """`[spool] path` edited and reloaded, then a worker killed: the restarted worker opens
    the shard it had, whose mail the queue still shows and which is delivered."""
    port = free_port()  # nothing listens here yet: the mail waits
    with PigeonProcess(tmp_path / "node", node={"workers": 2}, **delivery_config(f"127.0.0.1:{port}")) as pigeon:
        assert _send(pigeon, 20) == [250] * 20
        shards = _per_shard(pigeon.spool_path)
        assert shards.get("shard-0", 0) > 0 and shards.get("shard-1", 0) > 0, shards
        _edit(pigeon, "spool", path="spool-elsewhere")
        _hangup(pigeon)
        assert "reload: [spool] path changed; it takes effect at the next restart" in pigeon.stderr()
        _kill_worker_1(pigeon)
        status, queues = pigeon.http_call("GET", "/api/v1/queues", token=pigeon.local_token)
        assert status == 200, queues
        held = sum(row["messages"] for row in queues["scheduled"]) + sum(
            row.get("messages", 0) for row in queues["ready"]
        )
        assert held == 20, queues
        with ScriptedSink(port=port) as sink:
            assert len(sink.wait_for(20, timeout=30)) == 20
        assert not list((tmp_path / "node" / "spool-elsewhere").glob("shard-*"))


def test_a_restarted_worker_routes_as_the_last_reload_said_not_as_the_file_says_since(tmp_path: Path) -> None:
    """A route changed and reloaded, then edited again without a reload, then a worker
    killed: the restarted worker, like the other, routes as the last reload said."""
    with ScriptedSink() as first, ScriptedSink() as reloaded, ScriptedSink() as unreloaded:
        config = delivery_config(first.endpoint)
        with PigeonProcess(tmp_path / "node", node={"workers": 2}, **config) as pigeon:
            pigeon.config["route"][0]["next_hop"] = reloaded.endpoint
            pigeon.config_path.write_text(to_toml(pigeon.config))
            _hangup(pigeon)
            edited = json.loads(json.dumps(pigeon.config))
            edited["route"][0]["next_hop"] = unreloaded.endpoint  # not reloaded: not in force
            pigeon.config_path.write_text(to_toml(edited))
            _kill_worker_1(pigeon)
            assert _send(pigeon, 20) == [250] * 20
            assert len(reloaded.wait_for(20, timeout=30)) == 20
            time.sleep(0.5)
            assert (len(first.received), len(unreloaded.received)) == (0, 0)
            said = pigeon.stderr()
        assert _received_by(pigeon, 1) > 0  # the restarted worker took some (and delivered them: its shard's)
    after_restart = said.split("worker 1 started", 2)[2]
    assert "w1 INFO pigeon.node.node: reload: taking the configuration the node reloaded" in after_restart


def _worker_1_health(pigeon: PigeonProcess) -> dict[str, object]:
    _, body = pigeon.http_get("/healthz")
    worker: dict[str, object] = json.loads(body)["workers"][1]
    return worker


def test_a_restarted_worker_whose_reloaded_key_is_gone_cannot_start_and_nothing_goes_by_the_replaced_route(
    tmp_path: Path,
) -> None:
    """A route and a TLS pair changed and reloaded, then the key moved away and a worker
    killed: the restarted worker cannot start (it says why, /healthz says it is down), rather
    than start on the configuration the node started with and deliver its shard's mail by the
    route the reload replaced; the other worker goes on. Put back, the worker starts."""
    certificate, key = ensure_self_signed(tmp_path / "tls", "mx.pigeon.test")
    with ScriptedSink() as replaced, ScriptedSink() as reloaded:
        config = delivery_config(replaced.endpoint)
        with PigeonProcess(tmp_path / "node", node={"workers": 2}, **config) as pigeon:
            assert _send(pigeon, 10) == [250] * 10  # mail in both shards, delivered by the first route
            assert len(replaced.wait_for(10, timeout=30)) == 10
            edited = json.loads(json.dumps(pigeon.config))
            edited["route"][0]["next_hop"] = reloaded.endpoint
            edited["smtp"].update(tls_certificate=str(certificate), tls_private_key=str(key))
            pigeon.config_path.write_text(to_toml(edited))
            _hangup(pigeon)
            key.rename(key.with_suffix(".away"))
            os.kill(pigeon.shard_owner(1), signal.SIGKILL)
            deadline = time.monotonic() + 20
            while "tls_private_key" not in str(_worker_1_health(pigeon).get("error", "")):
                assert time.monotonic() < deadline, _worker_1_health(pigeon)
                time.sleep(0.2)
            assert _worker_1_health(pigeon)["status"] == "down"
            _, body = pigeon.http_get("/healthz")
            assert json.loads(body)["spool"]["uncounted"] == [1]  # (its shard's mail is not in the sum)
            assert "worker 1: cannot start: configuration error" in pigeon.stderr()
            assert _send(pigeon, 10) == [250] * 10  # taken by worker 0
            assert len(reloaded.wait_for(10, timeout=30)) == 10
            time.sleep(1.0)  # a delivery by the replaced route would have come by now
            assert len(replaced.received) == 10
            key.with_suffix(".away").rename(key)
            deadline = time.monotonic() + 40  # (its next try, after a growing wait)
            while _worker_1_health(pigeon)["status"] != "ok":
                assert time.monotonic() < deadline, _worker_1_health(pigeon)
                time.sleep(0.2)
            _, body = pigeon.http_get("/healthz")
            assert "uncounted" not in json.loads(body)["spool"]
            assert _send(pigeon, 10) == [250] * 10
            assert len(reloaded.wait_for(20, timeout=30)) == 20
            assert len(replaced.received) == 10
        assert _received_by(pigeon, 1) > 0  # the worker started again took some


def test_a_reload_that_did_not_load_is_still_reported_after_the_workers_restart(tmp_path: Path) -> None:
    """A config file that no longer loads, reloaded: /healthz says `config` degraded, and
    still does once every worker has been started again (they run the last text that
    loaded and know nothing of this one); the node's next start would fail. Until a reload
    loads again."""
    with PigeonProcess(tmp_path / "node", node={"workers": 2}) as pigeon:
        _edit(pigeon, "spool", colour="red")
        assert pigeon.process is not None
        pigeon.process.send_signal(signal.SIGHUP)
        pigeon.wait_stderr("pigeon.node.node: reload failed", count=2)  # (the supervisor's own not counted)
        _kill_worker_1(pigeon, 0)
        _kill_worker_1(pigeon, 1)
        status, body = pigeon.http_get("/healthz")
        health = json.loads(body)
        # The restarted workers know nothing of it:
        assert [w["config"] for w in health["workers"]] == [{"status": "ok"}] * 2
        assert health["config"]["status"] == "degraded", health
        assert "colour" in health["config"]["error"]
        assert (status, health["status"]) == (200, "degraded")
        pigeon.config_path.write_text(to_toml(pigeon.config))  # fixed, and reloaded
        _hangup(pigeon)
        _, body = pigeon.http_get("/healthz")
        assert json.loads(body)["config"] == {"status": "ok"}


def test_a_restarted_worker_starts_on_the_reloaded_keys_once_the_old_ones_are_removed(tmp_path: Path) -> None:
    """An operator reloads onto a new TLS pair, users file and DKIM key, then removes the old
    ones (retired), and a worker is killed (a crash, the OOM killer, `worker_timeout`): it
    starts again, without the files the reload stopped using, and serves with the new ones:
    their certificate, their users, mail signed with the new key. Before, it read the
    start-time text's files first, and crash-looped on the first one gone."""
    old_pair = ensure_self_signed(tmp_path / "old-tls", "old.pigeon.test")
    new_pair = ensure_self_signed(tmp_path / "new-tls", "new.pigeon.test")
    old_users, new_users = tmp_path / "old-users", tmp_path / "new-users"
    set_password(old_users, "alice", "old secret")
    set_password(new_users, "alice", "new secret")
    old_key, new_key = tmp_path / "old.pem", tmp_path / "new.pem"
    write_key(old_key, generate_key("ed25519-sha256"))
    write_key(new_key, generate_key("ed25519-sha256"))
    smtp = {"tls_certificate": str(old_pair[0]), "tls_private_key": str(old_pair[1]), "auth_users": str(old_users)}
    dkim = [{"domain": "example.org", "selector": "old", "private_key": str(old_key), "algorithm": "ed25519-sha256"}]
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint)
        with PigeonProcess(tmp_path / "node", node={"workers": 2}, smtp=smtp, dkim=dkim, **config) as pigeon:
            edited = json.loads(json.dumps(pigeon.config))
            edited["smtp"].update(tls_certificate=str(new_pair[0]), tls_private_key=str(new_pair[1]))
            edited["smtp"]["auth_users"] = str(new_users)
            edited["dkim"][0].update(selector="new", private_key=str(new_key))
            pigeon.config_path.write_text(to_toml(edited))
            _hangup(pigeon)
            for retired in (*old_pair, old_users, old_key):
                retired.unlink()
            _kill_worker_1(pigeon)  # (it fails if the worker does not come back)
            assert "worker 1: cannot start" not in pigeon.stderr()
            for _ in range(12):  # new connections, whichever worker takes each: both serve the new files
                with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                    client.starttls()
                    certificate = client.sock.getpeercert(binary_form=True)  # type: ignore[union-attr]
                    assert certificate == ssl.PEM_cert_to_DER_cert(new_pair[0].read_text())
                    client.login("alice", "new secret")
                    client.sendmail("alice@example.org", ["bob@dst.test"], MESSAGE)
            received = sink.wait_for(12, timeout=30)
        assert _received_by(pigeon, 1) > 0  # the worker started again took some
    assert all(b"s=new;" in message.data for message in received), [m.data[:400] for m in received]
