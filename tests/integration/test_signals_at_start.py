"""SIGHUP (and SIGTERM, SIGINT) at any moment of a node's life: while it starts, while a worker
restarts. A reload never kills the node or a worker, and one asked for before the node could act
on it is applied once it can; a stop during start-up is an ordinary stop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import smtplib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from pigeon.config.load import load
from pigeon.node.node import Node
from tests.support.ports import free_port
from tests.support.process import PigeonProcess, to_toml

# A policy module that holds a process in the middle of its start, after it has read its config,
# until the test creates `go`: what the test changes meanwhile is what a reload must bring. WHO
# says which process, and where: a worker (`--worker`), where its node starts; a lone node where
# `pigeon serve` checks the module, before its loop runs.
_GATE = """
import asyncio, os, sys, time
from pathlib import Path

def looping():
    try:
        return asyncio.get_running_loop() is not None
    except RuntimeError:
        return False

here = Path(__file__).parent
if WHO and not (here / "go").exists():
    (here / f"starting-{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while not (here / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
"""
_HELD: Final = {
    "worker": '"--worker" in sys.argv',
    "before its loop": "not looping()",
}
_START = 120.0  # seconds a node may take to start: several processes import on a small, busy machine


def _holds_its_signals(pid: int) -> bool:
    """Whether Pigeon has taken SIGHUP, SIGINT and SIGTERM in hand (blocked, or caught by the
    loop), so that none of their default actions applies. Ignored does not count: a process
    started under nohup, or in the background of a script, inherits SIGHUP or SIGINT ignored
    before Pigeon runs a line, and a signal sent then is lost, not held."""
    fields = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line
    )
    taken = int(fields["SigBlk"], 16) | int(fields["SigCgt"], 16)
    return all(taken & 1 << (signum - 1) for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM))


def _wait_until_it_holds_its_signals(pigeon: PigeonProcess) -> None:
    """The process's first moments: the interpreter's own start, before any of Pigeon's code."""
    assert pigeon.process is not None
    deadline = time.monotonic() + 10
    while not _holds_its_signals(pigeon.process.pid):
        assert pigeon.process.poll() is None and time.monotonic() < deadline, pigeon.stderr()
        time.sleep(0.001)


@contextlib.contextmanager
def _hanging_up(pid: int, every: float) -> Iterator[list[float]]:
    """SIGHUP to `pid` every `every` seconds while in the block; yields when each was sent."""
    sent: list[float] = []
    done = threading.Event()

    def hang_up() -> None:
        while not done.is_set():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGHUP)
                sent.append(time.monotonic())
            done.wait(every)

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        done.set()
        thread.join()


def _health(pigeon: PigeonProcess) -> dict[str, object]:
    status, body = pigeon.http_get("/healthz")
    health: dict[str, object] = json.loads(body)
    health["http_status"] = status
    return health


@pytest.mark.parametrize(("workers", "held"), [(2, "worker"), (1, "before its loop")])
def test_sighup_from_the_first_moment_kills_nothing_and_the_config_changed_meanwhile_is_taken(
    tmp_path: Path, workers: int, held: str
) -> None:
    root = tmp_path / "node"
    root.mkdir()
    (root / "gate.py").write_text(_GATE.replace("WHO", _HELD[held]))
    pigeon = PigeonProcess(root, node={"workers": workers}, policy={"module": "gate.py"})
    pigeon.start(wait=False)
    try:
        assert pigeon.process is not None
        _wait_until_it_holds_its_signals(pigeon)
        with _hanging_up(pigeon.process.pid, 0.02) as sent:
            deadline = time.monotonic() + _START
            while len(list(root.glob("starting-*"))) < workers:  # each worker has read its config
                assert pigeon.process.poll() is None, pigeon.stderr()
                assert time.monotonic() < deadline, pigeon.stderr()
                time.sleep(0.02)
            pigeon.config["smtp"]["starttls"] = False
            pigeon.config_path.write_text(to_toml(pigeon.config))
            changed = time.monotonic()
            time.sleep(0.2)
        assert len([at for at in sent if at > changed]) >= 3, "no SIGHUP after the change"
        assert pigeon.process.poll() is None, pigeon.stderr()
        (root / "go").touch()
        pigeon.wait_ready(_START)
        roles = [f"w{index}" for index in range(workers)] if workers > 1 else ["main"]
        for role in roles:  # each process, whichever takes the connections below
            pigeon.wait_stderr(f" {role} INFO pigeon.node.node: reloaded: TLS off", timeout=30)
        for _ in range(6):
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                client.ehlo()
                assert not client.has_extn("starttls")
                assert client.sendmail("a@src.test", ["b@dst.test"], b"Subject: hi\r\n\r\nhello\r\n") == {}
        if workers > 1:
            health = _health(pigeon)
            assert [w["restarts"] for w in health["workers"]] == [0] * workers, health  # type: ignore[attr-defined]
        assert "killed by" not in pigeon.stderr()
        assert pigeon.stop() == 0
    except BaseException:
        print(pigeon.stderr()[-20_000:])
        raise
    finally:
        pigeon.kill()


def test_sighup_while_a_worker_restarts_does_not_kill_it_again(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", node={"workers": 2}) as pigeon:
        assert pigeon.process is not None
        pids = pigeon.shard_owners()
        os.kill(pids[1], signal.SIGKILL)
        with _hanging_up(pigeon.process.pid, 0.2):
            deadline = time.monotonic() + _START
            while True:
                health = _health(pigeon)
                if health["http_status"] == 200 and health["workers"][1]["restarts"] >= 1:  # type: ignore[index]
                    break
                assert time.monotonic() < deadline, pigeon.stderr()
                time.sleep(0.2)
            time.sleep(1)  # SIGHUPs to the worker that is up again: reloads
        health = _health(pigeon)
        assert health["http_status"] == 200, health
        assert [w["restarts"] for w in health["workers"]] == [0, 1], health  # type: ignore[attr-defined]
        assert "killed by SIGHUP" not in pigeon.stderr()
        assert re.search(r" w1 INFO pigeon\.node\.node: reloaded:", pigeon.stderr()), pigeon.stderr()


@pytest.mark.parametrize(("stop", "workers"), [(signal.SIGTERM, 2), (signal.SIGINT, 1)])
def test_a_stop_during_start_up_is_a_clean_stop(tmp_path: Path, stop: signal.Signals, workers: int) -> None:
    pigeon = PigeonProcess(tmp_path / "node", node={"workers": workers})
    pigeon.start(wait=False)
    try:
        assert pigeon.process is not None
        _wait_until_it_holds_its_signals(pigeon)
        pigeon.process.send_signal(stop)
        assert pigeon.wait_exit(_START) == 0, pigeon.stderr()
        assert "Traceback" not in pigeon.stderr()
        assert "cannot start" not in pigeon.stderr()
    finally:
        pigeon.kill()


async def test_a_reload_asked_for_while_the_node_starts_is_done_once_it_has_started(tmp_path: Path) -> None:
    """The loop may run a SIGHUP's handler while the node's start waits (on a spool's full disk,
    an IMAP server): the file read again then is the one the node must end up on."""
    config = {
        "node": {"name": "reload", "workers": 1},
        "smtp": {"listen": [f"127.0.0.1:{free_port()}"], "hostname": "mx.pigeon.test"},
        "http": {"listen": f"127.0.0.1:{free_port()}"},
        "spool": {"path": "spool"},
        "log": {"path": "log"},
        "delivery": {"enabled": False},
        "dns": {"nameservers": ["127.0.0.1:9"], "timeout": "1s"},
    }
    path = tmp_path / "pigeon.toml"
    path.write_text(to_toml(config))
    node = Node(load(path), config_path=path)
    node.reload()  # what the SIGHUP handler calls, before the node has started
    config["smtp"]["starttls"] = False
    path.write_text(to_toml(config))
    running = asyncio.create_task(node.run())
    try:
        deadline = time.monotonic() + 30
        while not node.http_address:  # the last of its start
            assert not running.done() and time.monotonic() < deadline
            await asyncio.sleep(0.01)
        # The reload reads the file on a thread once the start has ended: the new config is
        # taken a moment later, not necessarily before a client's first EHLO.
        deadline = time.monotonic() + 10
        while await asyncio.to_thread(_offers_starttls, config["smtp"]["listen"][0]):
            assert time.monotonic() < deadline, "the reload asked for during start-up was never done"
            await asyncio.sleep(0.05)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


def _offers_starttls(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with smtplib.SMTP(host, int(port), timeout=10) as client:
        client.ehlo()
        return client.has_extn("starttls")


# A policy module whose import takes 100 s in the processes WHO names, after it says so.
_SLOW = """
import asyncio, os, sys, time
from pathlib import Path

def looping():
    try:
        return asyncio.get_running_loop() is not None
    except RuntimeError:
        return False

if WHO:
    (Path(__file__).parent / f"importing-{os.getpid()}").touch()
    time.sleep(100)
"""


@pytest.mark.parametrize(
    ("workers", "who", "stop"),
    [
        (1, "looping()", signal.SIGINT),  # the lone node's import (its only one), in its loop
        (1, "looping()", signal.SIGTERM),
        (2, '"--worker" not in sys.argv', signal.SIGTERM),  # the supervisor's check
        (2, '"--worker" in sys.argv', signal.SIGTERM),  # the workers' imports: the supervisor passes it on
    ],
)
def test_a_stop_while_the_policy_module_imports_stops_the_node_at_once(
    tmp_path: Path, workers: int, who: str, stop: signal.Signals
) -> None:
    root = tmp_path / "node"
    root.mkdir()
    (root / "slow.py").write_text(_SLOW.replace("WHO", who))
    pigeon = PigeonProcess(root, node={"workers": workers}, policy={"module": "slow.py"})
    pigeon.start(wait=False)
    try:
        assert pigeon.process is not None
        importing = workers if "--worker" in who and " not " not in who else 1
        deadline = time.monotonic() + _START
        while len(list(root.glob("importing-*"))) < importing:
            assert pigeon.process.poll() is None and time.monotonic() < deadline, pigeon.stderr()
            time.sleep(0.02)
        time.sleep(1)
        pigeon.process.send_signal(stop)
        stopped = time.monotonic()
        assert pigeon.wait_exit(30) == 0, pigeon.stderr()
        assert time.monotonic() - stopped < 5, pigeon.stderr()
        said = pigeon.stderr()
        assert f"{stop.name} while importing the policy module {root / 'slow.py'}: stopped during start-up" in said
        assert "Traceback" not in said and "cannot start" not in said, said
        for marker in root.glob("importing-*"):  # no process left importing
            with pytest.raises(ProcessLookupError):
                os.kill(int(marker.name.removeprefix("importing-")), 0)
    finally:
        pigeon.kill()


_SWALLOWING = """
import os, time
from pathlib import Path

(Path(__file__).parent / f"importing-{os.getpid()}").touch()
for _ in range(30):  # "wait for the database": whatever interrupts a try is swallowed
    try:
        time.sleep(0.1)
    except BaseException:
        pass
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stop_that_the_policy_module_swallows_still_stops_the_node_once_the_import_ends(
    tmp_path: Path, workers: int
) -> None:
    root = tmp_path / "node"
    root.mkdir()
    (root / "swallows.py").write_text(_SWALLOWING)
    pigeon = PigeonProcess(root, node={"workers": workers}, policy={"module": "swallows.py"})
    pigeon.start(wait=False)
    try:
        assert pigeon.process is not None
        deadline = time.monotonic() + _START
        while not list(root.glob("importing-*")):
            assert pigeon.process.poll() is None and time.monotonic() < deadline, pigeon.stderr()
            time.sleep(0.02)
        time.sleep(0.5)
        pigeon.process.send_signal(signal.SIGTERM)
        assert pigeon.wait_exit(30) == 0, pigeon.stderr()
        said = pigeon.stderr()
        assert "SIGTERM while importing the policy module" in said, said
        # Nothing went on to start ("restarted" is in the delivery-off warning, said before).
        assert not re.search(r"\bstarted\b", said) and "listening" not in said, said
    finally:
        pigeon.kill()


# A module that never returns from its import, and says where it is stuck first.
_STUCK = """
import time
from pathlib import Path

Path(MARK).touch()
while True:
    time.sleep(0.5)
"""
_FOREVER_SWALLOWING = """
import time
from pathlib import Path

(Path(__file__).parent / "stuck").touch()
while True:  # "wait for the database", for ever: whatever interrupts a try is swallowed
    try:
        time.sleep(0.1)
    except BaseException:
        pass
"""


@pytest.mark.parametrize(
    ("stuck_in", "stops"),
    [
        ("dns", 1),  # the delivery side's import (dnspython), in the node's start on its loop
        ("uvloop", 2),  # before the loop runs
        ("the policy module", 2),  # its import, which swallows the stop
    ],
)
def test_a_stop_during_a_start_up_stuck_in_an_import_ends_the_node_in_bounded_time_saying_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stuck_in: str, stops: int
) -> None:
    """One stop: the node exits once the grace (10 s) for the start-up to get to it is over;
    another stop: at once. Either way it says what its start was stuck in."""
    root = tmp_path / "node"
    root.mkdir()
    mark = root / "stuck"
    sections: dict[str, dict[str, object]] = {"delivery": {"enabled": True}}
    if stuck_in == "the policy module":
        (root / "forever.py").write_text(_FOREVER_SWALLOWING)
        sections["policy"] = {"module": "forever.py"}
        where = str(root / "forever.py")
    else:
        # A module of that name ahead of the installed one on PYTHONPATH: what an operator's
        # environment, or a broken install, can do to any import.
        package = tmp_path / "shadows" / stuck_in
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(_STUCK.replace("MARK", repr(str(mark))))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "shadows"), os.environ.get("PYTHONPATH", "")]))
        where = str(package / "__init__.py")
    pigeon = PigeonProcess(root, **sections)  # type: ignore[arg-type]
    pigeon.start(wait=False)
    try:
        assert pigeon.process is not None
        deadline = time.monotonic() + _START
        while not mark.exists():
            assert pigeon.process.poll() is None and time.monotonic() < deadline, pigeon.stderr()
            time.sleep(0.02)
        time.sleep(0.5)
        pigeon.process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        if stops == 2:
            time.sleep(1.5)  # (one a moment after the first is the same stop, said twice)
            pigeon.process.send_signal(signal.SIGTERM)
            stopped = time.monotonic()
        assert pigeon.wait_exit(30) == 1, pigeon.stderr()
        waited = time.monotonic() - stopped
        assert (waited < 3) if stops == 2 else (9 < waited < 15), (waited, pigeon.stderr())
        said = pigeon.stderr()
        assert f"SIGTERM during start-up, which is stuck in {where}:" in said, said  # the module's own line
    finally:
        pigeon.kill()
