"""A password kept in a file (`[[route]] auth_password_file`, `[[mailbox]] password_file`):
its first line, whatever characters the password holds but a line end."""

from __future__ import annotations

from pathlib import Path

import pytest

from pigeon.config.secret_file import first_line


@pytest.mark.parametrize("inside", ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_a_password_is_not_cut_at_characters_that_python_counts_as_line_ends(tmp_path: Path, inside: str) -> None:
    password = f"pass{inside}word"
    (tmp_path / "secret").write_text(f"{password}\nsecond line\n", encoding="utf-8")
    assert first_line(tmp_path / "secret") == password


@pytest.mark.parametrize("written", ["s3cret\n", "s3cret\r\n", "  s3cret \t\n", "s3cret", "s3cret\nother\n"])
def test_the_first_line_is_taken_without_its_line_end_or_the_blanks_around_it(tmp_path: Path, written: str) -> None:
    (tmp_path / "secret").write_bytes(written.encode())
    assert first_line(tmp_path / "secret") == "s3cret"


def test_an_empty_file_is_an_empty_password(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("")
    assert first_line(tmp_path / "secret") == ""


def test_a_lone_carriage_return_is_part_of_the_password_not_its_end(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"pass\rword\r\nsecond line\n")
    assert first_line(tmp_path / "secret") == "pass\rword"


def test_a_utf8_byte_order_mark_an_editor_put_first_is_not_part_of_the_password(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes("\ufeffs3cr\u00e9t\n".encode())
    assert first_line(tmp_path / "secret") == "s3cr\u00e9t"
