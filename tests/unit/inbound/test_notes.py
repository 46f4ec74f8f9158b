"""A mailbox's note in memory (single-node mode) and as stored: what resolves it, what reads."""

from __future__ import annotations

import asyncio

from pigeon.inbound.notes import Note, Notes, note_key


def test_a_note_is_resolved_only_while_it_is_still_the_mailbox_s_note() -> None:
    async def scenario() -> tuple[Note | None, Note | None]:
        notes = Notes()
        mine = Note("ImapError: login as app: NO", "a", 1.0)
        await notes.write("box", mine)
        await notes.resolve("box", mine, 5.0)
        resolved = await notes.read("box")
        theirs = Note("OSError: Connection refused", "b", 6.0)
        await notes.write("box", theirs)
        await notes.resolve("box", mine, 7.0)  # too late: b's note stands
        return resolved, await notes.read("box")

    resolved, standing = asyncio.run(scenario())
    assert resolved == Note("ImapError: login as app: NO", "a", 1.0, resolved_at=5.0)
    assert standing == Note("OSError: Connection refused", "b", 6.0)


def test_a_stored_note_reads_back_and_anything_else_reads_as_none() -> None:
    note = Note("target hook refused every handoff of a batch for now: 503", "n1", 1700000000.5)
    assert Note.decode(note.encode()) == note
    assert Note.decode(b"set by hand") is None
    assert Note.decode(b'{"problem": "x"}') is None
    assert note_key("app@imap.example:993/INBOX") == "inbound:app@imap.example:993/INBOX:note"
