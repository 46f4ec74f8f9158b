"""The self-signed pair made at first start is one pair, even when several workers start at once."""

from __future__ import annotations

import multiprocessing
import ssl
from pathlib import Path

from pigeon.listener.tls import ensure_self_signed


def _make(directory: str) -> None:
    ensure_self_signed(Path(directory), "mx.pigeon.test")


def test_workers_starting_together_end_up_with_one_matching_certificate_and_key(tmp_path: Path) -> None:
    for round_no in range(5):  # the race needs a few tries to show without the lock
        directory = tmp_path / f"tls-{round_no}"
        context = multiprocessing.get_context("fork")
        workers = [context.Process(target=_make, args=(str(directory),)) for _ in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
            assert worker.exitcode == 0
        cert, key = ensure_self_signed(directory, "mx.pigeon.test")
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)  # raises on a mismatch
        assert sorted(p.name for p in directory.iterdir()) == [".lock", "selfsigned.crt", "selfsigned.key"]
        assert key.stat().st_mode & 0o077 == 0  # the private key is not readable by others


def test_an_existing_pair_is_kept(tmp_path: Path) -> None:
    cert, key = ensure_self_signed(tmp_path, "mx.pigeon.test")
    before = (cert.read_bytes(), key.read_bytes())
    assert ensure_self_signed(tmp_path, "mx.pigeon.test") == (cert, key)
    assert (cert.read_bytes(), key.read_bytes()) == before
