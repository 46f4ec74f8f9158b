"""A full spool answers 451 4.3.0, stores nothing half-way, and takes mail again once there is room."""

from __future__ import annotations

import os
import shutil
import smtplib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess


def _send_until_refused(port: int, body: bytes, limit: int = 500) -> tuple[int, tuple[int, bytes]]:
    accepted = 0
    with smtplib.SMTP("127.0.0.1", port) as client:
        client.ehlo("client.test")
        for _ in range(limit):
            client.mail("sender@example.org")
            client.rcpt("user@example.net")
            code, text = client.data(body)
            if code != 250:
                return accepted, (code, text)
            accepted += 1
    raise AssertionError(f"the spool never filled up after {limit} messages")


def test_spool_size_limit_refuses_with_451_and_keeps_what_it_accepted(tmp_path: Path) -> None:
    root = tmp_path / "node"
    body = b"Subject: filler\r\n\r\n" + (b"y" * 76 + b"\r\n") * 100
    with PigeonProcess(root, spool={"max_size": "400KiB"}) as pigeon:
        accepted, (code, text) = _send_until_refused(pigeon.smtp_port, body)
        assert (code, text[:5]) == (451, b"4.3.0")
        assert accepted > 10
        assert len(pigeon.spool_messages()) == accepted
        rejections = pigeon.wait_records("Rejection")
        assert rejections[-1]["response"]["code"] == 451
    with PigeonProcess(root, spool={"max_size": "4MiB"}) as pigeon:  # the operator made room
        assert len(pigeon.spool_messages()) == accepted
        assert "0 quarantined" in pigeon.stderr()
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            assert client.sendmail("sender@example.org", ["user@example.net"], body) == {}
        assert len(pigeon.spool_messages()) == accepted + 1


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs: a disk that really fills up (needs root, as CI has)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_full_disk_refuses_large_messages_with_451_and_leaves_no_partial_files(tiny_disk: Path, tmp_path: Path) -> None:
    root = tmp_path / "node"
    body = b"Subject: large\r\n\r\n" + (b"z" * 76 + b"\r\n") * 3000  # ~230 KB: spilled to a file
    spool = {"path": str(tiny_disk / "spool"), "inline_limit": "64KiB"}
    with PigeonProcess(root, spool=spool) as pigeon:
        accepted, (code, text) = _send_until_refused(pigeon.smtp_port, body, limit=100)
        assert (code, text[:5]) == (451, b"4.3.0")
        data_files = sorted((tiny_disk / "spool" / "shard-0" / "data").iterdir())
        stored = pigeon.spool_messages()
        assert len(stored) == accepted
        assert len(data_files) == accepted  # the refused message left nothing behind
        assert all(m["data"].endswith(body) for m in stored)
    with PigeonProcess(root, spool=spool) as pigeon:
        assert "0 quarantined" in pigeon.stderr()
        assert len(pigeon.spool_messages()) == accepted
