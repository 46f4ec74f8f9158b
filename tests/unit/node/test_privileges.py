"""Giving the spool to `[node] user` as root changes the owner of nothing outside the spool,
whatever the user (who controls the spool) has put in it or swaps in meanwhile."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from pathlib import Path

import pytest

from pigeon.node.privileges import PrivilegeError, RunAs, give_directories

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: changes owners")

NOBODY = RunAs("nobody", 65534, 65534, "/nonexistent")
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _victim(tmp_path: Path) -> Path:
    """A root-owned directory outside the spool with a root-only file in it."""
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    (victim / "shadow").write_text("root secret")
    (victim / "shadow").chmod(0o600)
    return victim


def _owners(victim: Path) -> set[tuple[int, int]]:
    return {(p.lstat().st_uid, p.lstat().st_gid) for p in (victim, *victim.rglob("*"))}


def test_the_spool_is_given_but_what_its_symlinks_point_to_is_not(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    spool = tmp_path / "spool"
    (spool / "sub").mkdir(parents=True)
    (spool / "sub" / "left-by-root").write_text("x")
    (spool / "to-dir").symlink_to(victim)
    (spool / "sub" / "to-file").symlink_to(victim / "shadow")
    give_directories([spool], NOBODY)
    assert _owners(victim) == {(0, 0)}
    assert {(p.lstat().st_uid, p.lstat().st_gid) for p in (spool, *spool.rglob("*"))} == {(65534, 65534)}


def test_a_spool_that_is_a_symlink_stops_start_up_and_its_target_keeps_its_owner(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    spool = tmp_path / "spool"
    spool.symlink_to(victim)
    with pytest.raises(PrivilegeError, match="symbolic link"):
        give_directories([spool], NOBODY)
    assert _owners(victim) == {(0, 0)}


def test_a_spool_of_a_third_user_stops_start_up(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    os.chown(spool, 12345, 12345)
    with pytest.raises(PrivilegeError, match="uid 12345"):
        give_directories([spool], NOBODY)


def test_a_hard_link_to_a_root_file_in_the_spool_keeps_its_owner(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    spool = tmp_path / "spool"
    spool.mkdir()
    os.link(victim / "shadow", spool / "linked")
    give_directories([spool], NOBODY)
    assert _owners(victim) == {(0, 0)}


def test_directories_swapped_for_symlinks_during_the_walk_lead_it_nowhere_else(tmp_path: Path) -> None:
    """The user swaps spool directories with symlinks to a root directory (renameat2
    RENAME_EXCHANGE, atomic) as fast as it can while the walk runs, many times over. (Once the
    spool is the user's, each walk still looks into every directory it reaches: a walk sent
    into the root directory would give its file away.)"""
    victim = _victim(tmp_path)
    spool = tmp_path / "spool"
    spool.mkdir()
    pairs = 40
    for i in range(pairs):
        (spool / f"d{i}").mkdir()
        (spool / f"d{i}" / "f").write_text("x")
        (spool / f"l{i}").symlink_to(victim)
    libc = ctypes.CDLL(None, use_errno=True)
    stop = threading.Event()

    def attack() -> None:
        names = [(bytes(spool / f"d{i}"), bytes(spool / f"l{i}")) for i in range(pairs)]
        while not stop.is_set():
            for a, b in names:
                libc.renameat2(_AT_FDCWD, a, _AT_FDCWD, b, _RENAME_EXCHANGE)

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and _owners(victim) == {(0, 0)}:
            give_directories([spool], NOBODY)
    finally:
        stop.set()
        attacker.join()
    assert _owners(victim) == {(0, 0)}
