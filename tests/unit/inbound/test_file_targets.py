"""The log and Maildir targets on a real filesystem: a batch is handed over whole, each
message once, and nothing counts as accepted that is not in the file or the Maildir."""

from __future__ import annotations

import errno
import json
import os
import tempfile
import time
from pathlib import Path

import pytest

from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets import maildir
from pigeon.inbound.targets.base import Verdict
from pigeon.inbound.targets.log import LogTarget
from pigeon.inbound.targets.maildir import MaildirTarget


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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncfs: bool
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
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
    assert [name.rpartition(".")[0] for name in tmp_first] == names and new_first == []
    assert tmp_then == [] and new_then == names


async def test_maildir_target_whose_syncfs_is_refused_fsyncs_each_file_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
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


async def test_maildir_target_that_cannot_link_answers_later_and_leaves_nothing_behind(tmp_path: Path) -> None:
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
