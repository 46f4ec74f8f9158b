"""Started as root, a node binds its ports (port 587 too), then every process runs as `[node] user`."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import secrets
import shutil
import smtplib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import zygote
from tests.support.ports import free_address
from tests.support.process import ROOT, PigeonProcess, to_toml
from tests.support.sinks import ScriptedSink, delivery_config

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates a user, binds port 587")


@pytest.fixture(scope="module")
def system_user() -> Iterator[pwd.struct_passwd]:
    """A throwaway system user (and group), removed afterwards. Directories on the way to the
    interpreter and the sources that only root may enter (here /root, home of pyenv) get an
    ACL entry letting this user through, also removed afterwards.

    Test processes running side by side (pytest-xdist workers each run some of this module's
    tests) each make a user and grant it the same directories: the grants and their removal
    happen under one machine-wide lock, and a directory's ACL is only cleared (setfacl -b)
    once no other user's entry is left in it."""
    name = f"pgt{secrets.token_hex(3)}"
    with _users_lock():  # useradd also refuses to run while another holds /etc/passwd
        subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
        )
    granted: list[Path] = []
    try:
        entry = pwd.getpwnam(name)
        needed = {Path(os.path.realpath(sys.executable)), Path(sys.prefix), ROOT / "src", ROOT}
        with _users_lock():
            for directory in sorted({parent for path in needed for parent in (path, *path.parents) if parent.is_dir()}):
                if not os.stat(directory).st_mode & 0o001:
                    subprocess.run(["setfacl", "-m", f"u:{name}:x", str(directory)], check=True)
                    granted.append(directory)
        runs = subprocess.run(["runuser", "-u", name, "--", sys.executable, "-c", "import pigeon"], capture_output=True)
        assert runs.returncode == 0, runs.stderr
        yield entry
    finally:
        with _users_lock():
            for directory in granted:
                subprocess.run(["setfacl", "-x", f"u:{name}", str(directory)], check=False)
                # -x leaves the mask entry the grant added, which shows as group permissions
                # in the mode: clear the ACL once only the mask is left (no one else's entry).
                acl = subprocess.run(["getfacl", "-cps", str(directory)], capture_output=True, text=True, check=False)
                base = ("user::", "group::", "other::", "mask::")
                if not [line for line in acl.stdout.splitlines() if line.strip() and not line.startswith(base)]:
                    subprocess.run(["setfacl", "-b", str(directory)], check=False)
            subprocess.run(["userdel", name], check=False)


@contextlib.contextmanager
def _users_lock() -> Iterator[None]:
    with open(Path(tempfile.gettempdir()) / "pigeon-test-users.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory the new user can reach (pytest's tmp_path is inside a root-only one)."""
    path = Path(tempfile.mkdtemp(prefix="pigeon-user-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _ids(pid: int) -> tuple[int, int, list[int]]:
    """The real uid, real gid and supplementary groups of a process, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0]), [int(g) for g in fields["Groups"].split()]


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                members.append(int(entry.name))
    return members


def test_a_root_started_node_binds_port_587_then_runs_every_process_as_the_user(
    system_user: pwd.struct_passwd, shared_tmp: Path
) -> None:
    uid, gid = system_user.pw_uid, system_user.pw_gid
    root = shared_tmp / "node"
    # What an earlier run as root left in the spool becomes the user's.
    (root / "spool").mkdir(parents=True)
    (root / "spool" / "left-by-root").write_text("x")
    with ScriptedSink() as sink:
        pigeon = PigeonProcess(root, node={"workers": 2, "user": system_user.pw_name}, **delivery_config(sink.endpoint))
        submission = free_address(587)  # not 127.0.0.1: whatever else runs may hold 587 there
        pigeon.config["smtp"]["listen"].append(f"{submission}:587")
        pigeon.config_path.write_text(to_toml(pigeon.config))
        with pigeon:
            assert pigeon.process is not None
            processes = _group_members(pigeon.process.pid)
            assert len(processes) == 3, processes  # the supervisor and two workers
            for pid in processes:
                assert _ids(pid) == (uid, gid, [gid]), pid
            for port, host in ((pigeon.smtp_port, "127.0.0.1"), (587, submission)):
                with smtplib.SMTP(host, port, timeout=10) as client:
                    client.sendmail("a@src.test", [f"ok@{port}.test"], b"Subject: hi\r\n\r\nhello\r\n")
            received = sink.wait_for(2)
            assert sorted(r.recipients[0] for r in received) == sorted(["ok@587.test", f"ok@{pigeon.smtp_port}.test"])
            pigeon.wait_records("Delivery", 2)
            status, _ = pigeon.http_get("/healthz")
            assert status == 200
        assert "running as root" not in pigeon.stderr()
        for directory in (root / "spool", root / "log"):
            paths = [directory, *directory.rglob("*")]
            assert len(paths) >= 2
            owners = {str(p): (p.lstat().st_uid, p.lstat().st_gid) for p in paths}
            assert set(owners.values()) == {(uid, gid)}, owners


def test_a_single_process_node_drops_too(system_user: pwd.struct_passwd, shared_tmp: Path) -> None:
    with PigeonProcess(shared_tmp / "node", node={"workers": 1, "user": system_user.pw_name}) as pigeon:
        assert pigeon.process is not None
        assert _ids(pigeon.process.pid)[0] == system_user.pw_uid
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
            client.sendmail("a@src.test", ["b@dst.test"], b"Subject: hi\r\n\r\nhello\r\n")
        assert len(pigeon.spool_messages()) == 1
    assert (shared_tmp / "node" / "spool").stat().st_uid == system_user.pw_uid


def test_the_capabilities_the_systemd_unit_keeps_are_enough_to_bind_give_and_drop(
    system_user: pwd.struct_passwd, shared_tmp: Path
) -> None:
    """Root limited to the unit's CapabilityBoundingSet, with no new privileges, as systemd runs it;
    the spool the user already owns (mode 0700) holds a file a run as root left there."""
    unit = (ROOT / "contrib" / "systemd" / "pigeon.service").read_text()
    setting = "CapabilityBoundingSet="
    kept = next(line.removeprefix(setting).split() for line in unit.splitlines() if line.startswith(setting))
    root = shared_tmp / "node"
    spool = root / "spool"
    spool.mkdir(parents=True, mode=0o700)
    (spool / "left-by-root").write_text("x")
    os.chown(spool, system_user.pw_uid, system_user.pw_gid)
    pigeon = PigeonProcess(root, node={"user": system_user.pw_name})
    smtp = free_address(25)
    pigeon.config["smtp"]["listen"].append(f"{smtp}:25")
    pigeon.config_path.write_text(to_toml(pigeon.config))
    bounding = ",".join(["-all", *(f"+{cap.removeprefix('CAP_').lower()}" for cap in kept)])
    command = ["setpriv", f"--bounding-set={bounding}", "--inh-caps=-all", "--no-new-privs", "--"]
    pigeon.process = subprocess.Popen(
        [*command, sys.executable, "-m", "pigeon", "serve", "-c", str(pigeon.config_path)],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=pigeon.stderr_path.open("ab"),
        start_new_session=True,
    )
    try:
        pigeon.wait_ready()
        with smtplib.SMTP(smtp, 25, timeout=10) as client:
            client.sendmail("a@src.test", ["b@dst.test"], b"Subject: hi\r\n\r\nhello\r\n")
        assert len(pigeon.spool_messages()) == 1
        assert (spool / "left-by-root").stat().st_uid == system_user.pw_uid
        assert _ids(pigeon.process.pid)[0] == system_user.pw_uid
        assert pigeon.stop() == 0
    finally:
        pigeon.kill()


def _serve(config: Path, *, user: str | None = None) -> subprocess.CompletedProcess[str]:
    prefix = ["runuser", "-u", user, "--"] if user is not None else []
    command = [*prefix, sys.executable, "-m", "pigeon", "serve", "-c", str(config)]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def test_an_unknown_user_stops_start_up_with_how_to_create_it(tmp_path: Path) -> None:
    pigeon = PigeonProcess(tmp_path, node={"user": "no-such-pigeon-user"})
    result = _serve(pigeon.config_path)
    assert result.returncode == 2  # a configuration error, naming the file and line
    assert f"configuration error: {pigeon.config_path}, line " in result.stderr
    assert "[node] user: no user called 'no-such-pigeon-user'" in result.stderr
    assert "useradd --system" in result.stderr
    assert not (tmp_path / "spool").exists()


def test_started_as_a_third_user_the_node_refuses_rather_than_run_as_the_wrong_one(
    system_user: pwd.struct_passwd, shared_tmp: Path
) -> None:
    pigeon = PigeonProcess(shared_tmp / "node", node={"user": "root"})
    pigeon.config_path.chmod(0o644)
    result = _serve(pigeon.config_path, user=system_user.pw_name)
    assert result.returncode == 1
    assert "[node] user = 'root': started as uid" in result.stderr
    assert "cannot switch users" in result.stderr


def test_started_as_root_without_a_user_the_node_says_so(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node") as pigeon:
        assert "running as root: every process of this node keeps full privileges" in pigeon.stderr()


@pytest.fixture
def stranger() -> Iterator[pwd.struct_passwd]:
    """A throwaway system user let through no directory: the interpreter under /root (pyenv's)
    is out of its reach."""
    name = f"pgs{secrets.token_hex(3)}"
    with _users_lock():
        subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
        )
    try:
        yield pwd.getpwnam(name)
    finally:
        with _users_lock():
            subprocess.run(["userdel", name], check=False)


def _refused_start(root: Path, *, workers: int, user: str) -> str:
    """What a node that must refuse to start as `user` said: it exits 1."""
    pigeon = PigeonProcess(root, node={"workers": workers, "user": user})
    pigeon.start(wait=False)
    try:
        assert pigeon.wait_exit() == 1
    finally:
        pigeon.kill()
    return pigeon.stderr()


def test_workers_the_user_cannot_start_the_interpreter_of_are_refused_with_its_path(
    stranger: pwd.struct_passwd, shared_tmp: Path
) -> None:
    interpreter = Path(sys.executable)
    runs = subprocess.run(["runuser", "-u", stranger.pw_name, "--", str(interpreter), "-c", "0"], capture_output=True)
    if runs.returncode == 0:
        pytest.skip(f"{interpreter} is within reach of every user here")
    said = _refused_start(shared_tmp / "node", workers=2, user=stranger.pw_name)
    assert f"pigeon: cannot start: the workers' interpreter {interpreter}" in said, said
    assert f"out of reach of the [node] user {stranger.pw_name!r}" in said, said
    assert "must be able to read and execute it" in said, said
    assert "worker 0 started" not in said  # checked before any worker is started


def test_a_single_process_node_the_user_cannot_load_python_from_is_refused_with_the_way_in(
    stranger: pwd.struct_passwd, shared_tmp: Path
) -> None:
    """One process imports as it runs, as the user: a node of one worker is stopped with the
    same plain reason as a node of several, not a traceback at its first import."""
    stdlib = os.path.dirname(os.__file__)
    runs = subprocess.run(["runuser", "-u", stranger.pw_name, "--", "ls", stdlib], capture_output=True)
    if runs.returncode == 0:
        pytest.skip(f"{stdlib} is within reach of every user here")
    said = _refused_start(shared_tmp / "node", workers=1, user=stranger.pw_name)
    assert "Traceback" not in said, said
    assert f"pigeon: cannot start: the interpreter {sys.executable}" in said, said
    assert f", or its standard library {stdlib}, is out of reach of the [node] user {stranger.pw_name!r}" in said, said
    way = reversed(Path(os.path.realpath(stdlib)).parents)
    closed = next((directory for directory in way if not directory.stat().st_mode & 0o001), None)
    if closed is not None:
        assert f"or let that user through: setfacl -m u:{stranger.pw_name}:x {closed})" in said, said
    else:
        assert f"(let that user read it: setfacl -m u:{stranger.pw_name}:rx {os.path.realpath(stdlib)})" in said, said
    assert not (shared_tmp / "node" / "spool" / "shard-0").exists()  # stopped before the node began


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_check_refuses_a_user_out_of_reach_of_the_interpreter_as_a_start_does_and_neither_makes_anything(
    stranger: pwd.struct_passwd, shared_tmp: Path, workers: int
) -> None:
    """Found from outside: --check passed such a config, whose start then failed, having
    made the spool and log directories and given them to the user already."""
    needed = sys.executable if workers > 1 else os.path.dirname(os.__file__)
    runs = subprocess.run(["runuser", "-u", stranger.pw_name, "--", "ls", needed], capture_output=True)
    if runs.returncode == 0 and workers == 1:
        pytest.skip(f"{needed} is within reach of every user here")
    root = shared_tmp / "node"
    said = _refused_start(root, workers=workers, user=stranger.pw_name)
    (refusal,) = [line for line in said.splitlines() if line.startswith("pigeon: cannot start: ")]
    assert f"out of reach of the [node] user {stranger.pw_name!r}" in refusal, said
    assert not (root / "spool").exists() and not (root / "log").exists(), said  # nothing made, nothing given
    check = zygote.run(
        ["serve", "--check", "-c", str(root / "pigeon.toml")],
        text=True,
        timeout=60,
    )
    assert (check.returncode, check.stdout, check.stderr) == (2, "", f"{refusal}\n")
    assert not (root / "spool").exists() and not (root / "log").exists()


def test_serve_check_judges_a_config_shared_with_the_users_group_as_that_user_would(
    system_user: pwd.struct_passwd, shared_tmp: Path
) -> None:
    """README's set-up: root owns the config, `chgrp pigeon` and 0640. --check run as root
    must not call that group's members others (the node's processes are in it)."""
    token = {"name": "app", "token": "0123456789abcdef0123456789abcdef", "scopes": ["inject"]}
    pigeon = PigeonProcess(shared_tmp / "node", node={"user": system_user.pw_name}, tables={"http.token": [token]})
    os.chown(pigeon.config_path, 0, system_user.pw_gid)
    pigeon.config_path.chmod(0o640)
    check = zygote.run(
        ["serve", "--check", "-c", str(pigeon.config_path)],
        text=True,
        timeout=60,
    )
    assert (check.returncode, check.stdout) == (0, f"{pigeon.config_path}: ok\n")
    assert "is readable by" not in check.stderr, check.stderr
    pigeon.config_path.chmod(0o644)
    check = zygote.run(
        ["serve", "--check", "-c", str(pigeon.config_path)],
        text=True,
        timeout=60,
    )
    assert check.returncode == 0
    assert f"pigeon: warning: {pigeon.config_path} is readable by other users (mode 0644)" in check.stderr
