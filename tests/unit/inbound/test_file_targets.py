"""The log and Maildir targets on a real filesystem: a batch is handed over whole, each
message once, and nothing counts as accepted that is not in the file or the Maildir."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import tempfile
import time
from pathlib import Path

import pytest

from pigeon.config.schema import MailboxConfig
from pigeon.inbound.arbitration import Claim, LocalArbiter, Standing
from pigeon.inbound.mailbox import MailboxWatcher, _Fetched
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets import maildir
from pigeon.inbound.targets.base import Verdict
from pigeon.inbound.targets.log import LogTarget
from pigeon.inbound.targets.maildir import MaildirTarget
from pigeon.logs.writer import LogWriter
from pigeon.metrics import Metrics

try:
    from pigeon.inbound.targets import _maildir
except ImportError:  # built without a C compiler: only the Python file work exists
    _maildir = None  # type: ignore[assignment]

IMPLEMENTATIONS = [
    pytest.param("c", id="c", marks=pytest.mark.skipif(_maildir is None, reason="built without a C compiler")),
    pytest.param("python", id="python"),
]


@pytest.fixture(params=IMPLEMENTATIONS)
def file_work(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each Maildir test runs on the C file work and on its Python fallback."""
    if request.param == "python":
        monkeypatch.setattr(maildir, "write_files", maildir._write_files)
        monkeypatch.setattr(maildir, "link_files", maildir._link_files)
    return str(request.param)


def mail(n: int) -> InboundMessage:
    raw = f"From: c{n}@example.com\r\nMessage-ID: <m{n}@example.com>\r\nSubject: q{n}\r\n\r\nHello {n}.\r\n"
    return InboundMessage.of(raw.encode(), "imap:support", time.time(), mailbox="app@h:143/INBOX", uidvalidity=1, uid=n)


async def test_log_target_writes_a_batch_as_one_json_line_per_message(tmp_path: Path) -> None:
    target = LogTarget("audit", tmp_path / "logs" / "inbound.jsonl")
    batch = [mail(n) for n in range(60)]
    answers = await target.deliver_many(batch)
    assert [a.verdict for a in answers] == [Verdict.ACCEPTED] * 60
    assert (await target.deliver(mail(60))).accepted
    lines = [json.loads(line) for line in (tmp_path / "logs" / "inbound.jsonl").read_bytes().splitlines()]
    assert [line["dedupe_key"] for line in lines] == [m.dedupe_key for m in [*batch, mail(60)]]
    assert lines[7]["raw"] == mail(7).raw.decode()
    assert ["Subject", "q7"] in lines[7]["headers"]


async def test_log_target_that_cannot_write_answers_later_for_the_whole_batch(tmp_path: Path) -> None:
    (tmp_path / "logs").write_text("a file where the log's directory should be")
    target = LogTarget("audit", tmp_path / "logs" / "inbound.jsonl")
    answers = await target.deliver_many([mail(1), mail(2)])
    assert [a.verdict for a in answers] == [Verdict.TRANSIENT] * 2
    assert "logs" in answers[0].detail


@pytest.mark.parametrize("syncfs", [True, False], ids=["syncfs", "fsync-per-file"])
async def test_maildir_target_writes_a_batch_once_each_into_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncfs: bool, file_work: str
) -> None:
    if not syncfs:  # as where Linux's syncfs(2) is not to be had
        monkeypatch.setattr(maildir, "_syncfs", None)
    elif maildir._syncfs is None or maildir.filesystem_type(tmp_path) not in maildir._SYNCFS_FILESYSTEMS:
        pytest.skip("no syncfs here")
    target = MaildirTarget("box", tmp_path / "Maildir")
    await target.start()
    try:
        (tmp_path / "Maildir" / "cur" / f"pigeon.{mail(3).dedupe_key}:2,S").write_bytes(mail(3).raw)  # read already
        answers = await target.deliver_many([mail(n) for n in (1, 2, 3, 2)])
        again = await target.deliver_many([mail(1), mail(4)])
    finally:
        await target.close()
    assert [a.verdict for a in answers + again] == [Verdict.ACCEPTED] * 6
    assert [a.detail.startswith("duplicate") for a in answers + again] == [False, False, True, True, True, False]
    new = sorted(path.read_bytes() for path in (tmp_path / "Maildir" / "new").iterdir())
    assert new == sorted(mail(n).raw for n in (1, 2, 4))
    assert not list((tmp_path / "Maildir" / "tmp").iterdir())


async def test_maildir_target_makes_the_files_durable_before_their_names_reach_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file_work: str
) -> None:
    if maildir._syncfs is None or maildir.filesystem_type(tmp_path) not in maildir._SYNCFS_FILESYSTEMS:
        pytest.skip("no syncfs here")
    seen: list[tuple[list[str], list[str]]] = []
    sync = maildir._sync_filesystem

    def watched(fd: int) -> None:
        seen.append(
            (sorted(os.listdir(tmp_path / "Maildir" / "tmp")), sorted(os.listdir(tmp_path / "Maildir" / "new")))
        )
        sync(fd)

    monkeypatch.setattr(maildir, "_sync_filesystem", watched)
    target = MaildirTarget("box", tmp_path / "Maildir")
    await target.start()
    try:
        answers = await target.deliver_many([mail(1), mail(2)])
    finally:
        await target.close()
    assert [a.verdict for a in answers] == [Verdict.ACCEPTED] * 2
    names = sorted(f"pigeon.{mail(n).dedupe_key}" for n in (1, 2))
    # One sync of the filesystem with the files in tmp/ and none in new/, then one with the
    # names in new/: a name in new/ (what the dedupe trusts) always has its bytes on disk.
    [(tmp_first, new_first), (tmp_then, new_then)] = seen
    assert [n.removesuffix(f".{maildir._HOST}.{os.getpid()}") for n in tmp_first] == names and new_first == []
    assert tmp_then == [] and new_then == names


async def test_maildir_target_whose_syncfs_is_refused_fsyncs_each_file_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, file_work: str
) -> None:
    calls: list[int] = []

    def refused(fd: int) -> None:  # as a sandbox's seccomp filter answers
        calls.append(fd)
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(maildir, "_syncfs", lambda fd: 0)
    monkeypatch.setattr(maildir, "_sync_filesystem", refused)
    monkeypatch.setattr(maildir, "filesystem_type", lambda path: "ext4")
    target = MaildirTarget("box", tmp_path / "Maildir")
    await target.start()
    try:
        first = await target.deliver_many([mail(1), mail(2)])
        then = await target.deliver_many([mail(3)])
    finally:
        await target.close()
    assert [a.verdict for a in first + then] == [Verdict.ACCEPTED] * 3
    assert len(calls) == 1  # asked once, then not again
    assert "syncfs refused" in caplog.text
    assert sorted(p.read_bytes() for p in (tmp_path / "Maildir" / "new").iterdir()) == sorted(
        mail(n).raw for n in (1, 2, 3)
    )


def test_syncfs_is_not_trusted_before_linux_5_8_nor_on_a_filesystem_it_may_not_make_durable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(maildir, "_kernel", lambda: (4, 18))  # syncfs said 0 after a failed write-back
    assert maildir._find_syncfs() is None
    assert maildir.filesystem_type(Path("/proc/self")) == "proc"
    assert "fuse" not in maildir._SYNCFS_FILESYSTEMS and "nfs" not in maildir._SYNCFS_FILESYSTEMS


async def test_maildir_target_that_cannot_link_answers_later_and_leaves_nothing_behind(
    tmp_path: Path, file_work: str
) -> None:
    target = MaildirTarget("box", tmp_path / "Maildir")
    await target.start()
    # new/ on another filesystem: the files are written and fsynced in tmp/, and linking
    # them into new/ fails (EXDEV).
    with tempfile.TemporaryDirectory(dir="/dev/shm") as elsewhere:
        (tmp_path / "Maildir" / "new").rmdir()
        (tmp_path / "Maildir" / "new").symlink_to(elsewhere)
        try:
            answers = await target.deliver_many([mail(1), mail(2)])
        finally:
            await target.close()
        assert not os.listdir(elsewhere)
    assert [a.verdict for a in answers] == [Verdict.TRANSIENT] * 2
    assert "Maildir" in answers[0].detail
    assert not list((tmp_path / "Maildir" / "tmp").iterdir())


async def test_a_prepared_maildir_batch_waits_in_tmp_durable_until_it_is_delivered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file_work: str
) -> None:
    # Prepared while the batch before is handed over: on disk, and nothing a reader of new/ sees.
    monkeypatch.setattr(maildir, "_syncfs", None)  # each file fsynced: counted
    synced: list[int] = []
    monkeypatch.setattr(maildir.os, "fsync", lambda fd: synced.append(fd))
    target = MaildirTarget("box", tmp_path / "Maildir")
    await target.start()
    batch = [mail(n) for n in (1, 2, 1)]
    try:
        prepared = await target.prepare(batch)
        assert prepared is not None
        assert len(os.listdir(tmp_path / "Maildir" / "tmp")) == 2 and len(synced) == 2
        assert not os.listdir(tmp_path / "Maildir" / "new")
        answers = await target.deliver_prepared(batch, prepared)
    finally:
        await target.close()
    assert [a.verdict for a in answers] == [Verdict.ACCEPTED] * 3
    assert [a.detail.startswith("duplicate") for a in answers] == [False, False, True]
    new = sorted(path.read_bytes() for path in (tmp_path / "Maildir" / "new").iterdir())
    assert new == sorted(mail(n).raw for n in (1, 2))
    assert not os.listdir(tmp_path / "Maildir" / "tmp")


async def test_a_prepared_maildir_batch_not_handed_over_whole_leaves_nothing_behind(
    tmp_path: Path, file_work: str
) -> None:
    target = MaildirTarget("box", tmp_path / "Maildir")
    await target.start()
    try:
        # Part of it handed over (the other claims lost meanwhile): the rest is not linked.
        prepared = await target.prepare([mail(1), mail(2)])
        answers = await target.deliver_prepared([mail(2)], prepared)
        assert [a.verdict for a in answers] == [Verdict.ACCEPTED]
        # None of it handed over.
        dropped = await target.prepare([mail(3)])
        assert dropped is not None
        await dropped.discard()
    finally:
        await target.close()
    assert [path.read_bytes() for path in (tmp_path / "Maildir" / "new").iterdir()] == [mail(2).raw]
    assert not os.listdir(tmp_path / "Maildir" / "tmp")


async def test_a_batch_the_mailbox_prepared_and_does_not_hand_over_is_undone(tmp_path: Path) -> None:
    # The hand-over of the batch before failed (the session lost, say): the batch fetched and
    # prepared meanwhile is given back, and its files in tmp/ go once they are written.
    target = MaildirTarget("box", tmp_path / "Maildir")
    await target.start()
    config = MailboxConfig(name="support", host="127.0.0.1", username="app", target="box")
    watcher = MailboxWatcher(config, target, LocalArbiter(), LogWriter(tmp_path / "log"), Metrics(),
                             retry_interval=1.0, max_retry_interval=2.0)  # fmt: skip
    claim = Claim(key="k", uid=1, standing=Standing.CLAIMED)
    fetched = _Fetched([(claim, mail(1)), (claim, mail(2))], [], [], 1, time.time())
    try:
        prepared = fetched.prepared = watcher._prepare(fetched)
        assert prepared is not None
        watcher._unprepare(fetched)  # before its files are even written
        assert (await prepared) is not None  # written (and durable): then undone
        await asyncio.sleep(0)  # (the undoing starts from the task's done callback)
        while watcher._chores:
            await asyncio.gather(*watcher._chores)
    finally:
        await target.close()
    assert not os.listdir(tmp_path / "Maildir" / "tmp")
    assert not os.listdir(tmp_path / "Maildir" / "new")


def test_the_maildir_file_work_is_in_c_where_it_was_built() -> None:
    if _maildir is None:
        pytest.skip("built without a C compiler")
    assert maildir.write_files is _maildir.write_files
    assert maildir.link_files is _maildir.link_files


@pytest.mark.parametrize("failing", ["name too long", "a directory in the way"])
def test_a_batch_that_cannot_be_written_leaves_no_file_behind_and_names_the_one_that_failed(
    tmp_path: Path, file_work: str, failing: str
) -> None:
    for sub in ("tmp", "new"):
        (tmp_path / sub).mkdir()
    bad = b"x" * 300 if failing == "name too long" else b"busy"
    (tmp_path / "tmp" / "busy").mkdir()
    (tmp_path / "new" / "there").write_bytes(b"already delivered")
    names = [b"one", b"there", b"three", b"four"]
    tmp_names = [b"one.1", b"there.1", bad, b"four.1"]
    new, tmp = os.open(tmp_path / "new", os.O_RDONLY), os.open(tmp_path / "tmp", os.O_RDONLY)
    try:
        with pytest.raises(OSError, match=r"too long|Is a directory") as failed:
            maildir.write_files(new, names, tmp, tmp_names, [b"H: 1\r\n"] * 4, [b"body\r\n"] * 4)
        assert os.fsencode(failed.value.filename) == bad
        assert failed.value.errno == (errno.ENAMETOOLONG if failing == "name too long" else errno.EISDIR)
        assert sorted(os.listdir(tmp_path / "tmp")) == ["busy"]
        fds = maildir.write_files(new, names, tmp, [b"one.1", b"there.1", b"three.1", b"four.1"],
                                  [b"H: 1\r\n", b"", b"", b"H: 4\r\n"], [b"a", b"b", b"", b"d" * 200_000])  # fmt: skip
        assert fds[1] == -1 and all(fd >= 0 for n, fd in enumerate(fds) if n != 1)
        written = [fd for fd in fds if fd >= 0]
        assert maildir.link_files(
            tmp, [b"one.1", b"three.1", b"four.1"], new, [b"one", b"three", b"four"], written
        ) == (
            3,
            0,
        )
    finally:
        os.close(new)
        os.close(tmp)
    assert (tmp_path / "new" / "one").read_bytes() == b"H: 1\r\na"
    assert (tmp_path / "new" / "three").read_bytes() == b""
    assert (tmp_path / "new" / "four").read_bytes() == b"H: 4\r\n" + b"d" * 200_000
    assert (tmp_path / "new" / "there").read_bytes() == b"already delivered"
    assert sorted(os.listdir(tmp_path / "tmp")) == ["busy"]


def test_the_python_link_files_goes_on_past_a_close_that_fails_as_the_c_one_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A close that fails (EIO on NFS) has freed its descriptor all the same. Raising there
    # left the caller to close every descriptor of the batch again, the freed ones included,
    # which by then may be another thread's socket or file.
    for sub in ("tmp", "new"):
        (tmp_path / sub).mkdir()
    new, tmp = os.open(tmp_path / "new", os.O_RDONLY), os.open(tmp_path / "tmp", os.O_RDONLY)
    try:
        names, tmp_names = [b"one", b"two"], [b"one.1", b"two.1"]
        fds = maildir._write_files(new, names, tmp, tmp_names, [b"H: 1\r\n"] * 2, [b"body\r\n"] * 2)
        closed: list[int] = []
        real_close = os.close

        def close(fd: int) -> None:
            closed.append(fd)
            real_close(fd)
            if fd == fds[0]:
                raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(os, "close", close)
        assert maildir._link_files(tmp, tmp_names, new, names, fds) == (2, 0)
        monkeypatch.undo()
        assert closed == fds
    finally:
        os.close(new)
        os.close(tmp)
    assert sorted(os.listdir(tmp_path / "new")) == ["one", "two"]
    assert os.listdir(tmp_path / "tmp") == []


def test_a_file_name_with_a_nul_is_refused_not_cut_short(tmp_path: Path, file_work: str) -> None:
    # C would stop reading the name at the NUL, and write and link another file than named.
    for sub in ("tmp", "new"):
        (tmp_path / sub).mkdir()
    new, tmp = os.open(tmp_path / "new", os.O_RDONLY), os.open(tmp_path / "tmp", os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="null"):
            maildir.write_files(new, [b"one"], tmp, [b"one.1\x00x"], [b""], [b"body"])
        assert os.listdir(tmp_path / "tmp") == []
        fds = maildir.write_files(new, [b"one"], tmp, [b"one.1"], [b""], [b"body"])
        with pytest.raises(ValueError, match="null"):
            maildir.link_files(tmp, [b"one.1"], new, [b"one\x00x"], fds)
        with contextlib.suppress(OSError):  # (the Python one closed it before it failed)
            os.close(fds[0])
    finally:
        os.close(new)
        os.close(tmp)
    assert os.listdir(tmp_path / "new") == []


async def test_files_a_killed_process_left_in_tmp_are_removed_at_start_and_no_others(tmp_path: Path) -> None:
    # Found from outside: kill -9 between writing and linking left 200 files in tmp/ for good.
    dead_pid = await asyncio.create_subprocess_exec("true")  # a process that has ended
    await dead_pid.wait()
    target = MaildirTarget("m", tmp_path / "Maildir")
    await target.start()
    tmp = tmp_path / "Maildir" / "tmp"
    left = {
        f"pigeon.{'a' * 64}.{maildir._HOST}.{dead_pid.pid}": True,  # this host's, its process gone
        f"pigeon.{'b' * 64}.{maildir._HOST}.{os.getpid()}": False,  # a live process's: in progress
        f"pigeon.{'c' * 64}.other-host.{dead_pid.pid}": False,  # another host's, recent: its own
        f"pigeon.{'d' * 64}.other-host.7": True,  # another host's, 2 days old
        "1733400000.M1P2.mua": False,  # another program's
    }
    for name in left:
        (tmp / name).write_bytes(b"Subject: x\r\n\r\n")
    old = time.time() - 48 * 3600
    os.utime(tmp / f"pigeon.{'d' * 64}.other-host.7", (old, old))
    await target.start()
    assert sorted(os.listdir(tmp)) == sorted(name for name, removed in left.items() if not removed)
