"""`[spool] max_size` caps the whole shard: its database, its segments and the files of bodies
over `inline_limit`. A body that does not fit is refused (SpoolFull, 452 4.3.1) and leaves nothing
behind; the files already there count from the start; freed files give their room back."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pigeon.message import Envelope, Message, Recipient, format_id
from pigeon.spool.spool import NewMessage, Settling, SpoolFull
from pigeon.spool.sqlite import SqliteSpool
from tests.unit.spool.test_group_commit import data_files, opened, rows
from tests.unit.spool.test_segments import deliver, settled, store

INLINE = 64 * 1024
LARGE = 300_000  # a body past INLINE: written to data/<id>
CAP = 1024 * 1024  # an empty spool's database takes 176 KiB of it


def capped(path: Path, max_size: int | None = CAP) -> SqliteSpool:
    return SqliteSpool(path, inline_limit=INLINE, max_size=max_size)


def large(n: int, size: int = LARGE) -> bytes:
    return (b"%06d " % n) * (size // 7) + b"x" * (size % 7)


def used(spool: SqliteSpool) -> int:
    """Bytes the shard takes: the database's pages in use, and the body files."""
    ((page_size, pages, unused),) = rows(
        spool.db_path, "SELECT * FROM pragma_page_size, pragma_page_count, pragma_freelist_count"
    )
    return int((pages - unused) * page_size) + sum(p.stat().st_size for p in spool.data_dir.iterdir())


async def fill(spool: SqliteSpool, size: int = LARGE) -> tuple[list[Message], SpoolFull]:
    stored: list[Message] = []
    for n in range(100):
        try:
            stored.append(await store(spool, large(n, size)))
        except SpoolFull as full:
            return stored, full
    pytest.fail(f"the spool took {len(stored)} bodies of {size} bytes under a {CAP}-byte max_size")


async def test_a_body_over_inline_limit_that_would_pass_max_size_is_refused_and_leaves_no_file(tmp_path: Path) -> None:
    spool = capped(tmp_path)
    with opened(spool):
        stored, refused = await fill(spool)
        assert len(stored) == 2  # 176 KiB + 2 x 300 KB fit in 1 MiB, a third does not
        assert "max_size" in str(refused) and (refused.reply.code, refused.reply.enhanced) == (452, "4.3.1")
        assert data_files(spool) == {format_id(m.body_id) for m in stored}
        assert used(spool) <= CAP
        assert [spool.body(m.body_id) for m in stored] == [large(0), large(1)]


async def test_a_large_body_stops_being_written_once_it_would_pass_max_size(tmp_path: Path) -> None:
    spool = capped(tmp_path)
    with opened(spool):
        (body_id,) = spool.new_ids(1)
        writer = spool.body_writer(body_id)
        chunk = b"z" * 64 * 1024
        for _ in range(8):  # 512 KiB: on its way to data/
            writer.write(chunk)
        assert data_files(spool) == {format_id(body_id)}
        for _ in range(1000):  # a 64 MiB message: refused past the cap, not at its end
            writer.write(chunk)
            if not data_files(spool):
                break
        assert writer.size < CAP
        with pytest.raises(SpoolFull, match="max_size"):
            writer.finish()
        assert spool.room() > CAP // 2  # what it had claimed is given back


async def test_large_bodies_written_side_by_side_cannot_pass_max_size_together(tmp_path: Path) -> None:
    spool = capped(tmp_path)
    with opened(spool):
        writers = [spool.body_writer(body_id) for body_id in spool.new_ids(4)]
        for _ in range(0, LARGE, 10_000):  # four receptions interleaved, as on the loop
            for writer in writers:
                writer.write(b"w" * 10_000)
        finished, refused = [], 0
        for writer in writers:
            try:
                finished.append(writer.finish())
            except SpoolFull:
                refused += 1
        # Each claims room as it grows: at most two fit, and when the room runs out while all
        # four are under way, the one that needed more gives its room back to the others.
        assert len(finished) <= 2 and refused >= 2
        assert data_files(spool) == {format_id(body.id) for body in finished}
        assert used(spool) <= CAP
        for body in finished:
            body.discard()
        assert data_files(spool) == set()


async def test_max_size_counts_data_files_already_in_the_spool_at_start(tmp_path: Path) -> None:
    spool = capped(tmp_path, max_size=None)
    with opened(spool):  # filled with no cap ...
        for n in range(3):
            await store(spool, large(n))
    spool = capped(tmp_path)  # ... then opened under one: 176 KiB + 900 KB leave no room for a fourth
    with opened(spool):
        assert spool.room() < CAP - 3 * LARGE
        stored, refused = await fill(spool)
        assert stored == [] and "max_size" in str(refused)
        assert len(data_files(spool)) == 3


async def test_space_freed_by_delivered_large_bodies_is_usable_again(tmp_path: Path) -> None:
    spool = capped(tmp_path)
    with opened(spool):
        empty = spool.room()
        for _ in range(3):  # full, emptied by delivery, full again: the room comes back each time
            stored, _ = await fill(spool)
            assert len(stored) == 2
            for message in stored:
                await deliver(spool, message)
            await settled(spool, rounds=2)
            assert data_files(spool) == set()
            assert spool.room() >= empty - 2 * 16384  # a page or two of rows may stay in use


async def test_an_orphan_data_file_counts_until_the_check_removes_it(tmp_path: Path) -> None:
    spool = capped(tmp_path)
    with opened(spool):
        kept = await store(spool, large(0))
    (tmp_path / "data" / format_id(1)).write_bytes(b"o" * LARGE)  # a reception that never committed
    spool = capped(tmp_path)
    with opened(spool):
        before = spool.room()
        report = await spool.check()
        assert report.orphan_files_removed == 1
        assert spool.room() == before + LARGE
        assert data_files(spool) == {format_id(kept.body_id)}


async def test_small_bodies_are_refused_once_large_ones_have_taken_max_size(tmp_path: Path) -> None:
    spool = capped(tmp_path)
    with opened(spool):
        await fill(spool)
        left = spool.room()
        small = [large(n, 4000) for n in range(50)]  # 200 KB, kept in the database
        refused = 0
        for data in small:
            try:
                await store(spool, data)
            except SpoolFull:
                refused += 1
        assert 0 < left < 150_000  # 200 KB of small bodies cannot all fit
        assert refused > 0
        assert used(spool) <= CAP


async def test_a_dsn_is_stored_in_a_full_spool_as_it_frees_the_message_it_reports_on(tmp_path: Path) -> None:
    spool = capped(tmp_path)
    with opened(spool):
        stored, _ = await fill(spool, 400_000)
        bounced = stored[0]
        body_id, dsn_id = spool.new_ids(2)
        writer = spool.body_writer(body_id)
        writer.write(b"Subject: Undelivered Mail\r\n\r\n" + b"r" * 8000)  # for the database
        now = time.time()
        dsn = NewMessage(dsn_id, "q@example.org", Envelope("", [Recipient("s@example.org")]), now, now)
        await spool.store(writer.finish(), [dsn], settles=Settling(bounced, None, 1, 0.0))
        await settled(spool, rounds=2)
        assert spool.get(bounced.id) is None and spool.get(dsn_id) is not None
        assert format_id(bounced.body_id) not in data_files(spool)
