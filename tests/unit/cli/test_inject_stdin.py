"""`pigeon inject` without a message file or parts reads the message from stdin when it is
piped, as sendmail does: an MTA or a script pipes mail to it without a `-`."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from pigeon.cli.inject import _request


class _Stdin(io.TextIOWrapper):
    def __init__(self, data: bytes, *, terminal: bool) -> None:
        super().__init__(io.BytesIO(data), encoding="utf-8")
        self._terminal = terminal

    def isatty(self) -> bool:
        return self._terminal


def _args(*message: str, **parts: object) -> argparse.Namespace:
    given: dict[str, object] = {"subject": None, "text": None, "html": None, "attach": [], "header": [], **parts}
    return argparse.Namespace(message=message[0] if message else None, sender="a@example.org", to=["b@example.net"],
                              var=[], template=False, no_template=False, tenant=None, campaign=None,
                              **given)  # fmt: skip


MESSAGE = b"From: a@example.org\nSubject: piped\n\nHello.\n"


def test_a_piped_message_is_read_without_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", _Stdin(MESSAGE, terminal=False))
    request = _request(_args())
    assert request["content"] == MESSAGE.decode()
    assert request["recipients"] == [{"email": "b@example.net"}]


def test_a_piped_mbox_envelope_line_is_dropped_as_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", _Stdin(b"From a@example.org Mon Jan  1 00:00:00 2024\n" + MESSAGE, terminal=False))
    assert _request(_args())["content"] == MESSAGE.decode()


def test_on_a_terminal_neither_a_file_nor_parts_is_still_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a wait for mail typed at the terminal: the operator forgot the file."""
    monkeypatch.setattr("sys.stdin", _Stdin(MESSAGE, terminal=True))
    with pytest.raises(ValueError, match=r"give either a message file \(or -, or pipe it on stdin\) or parts"):
        _request(_args())


def test_an_empty_piped_stdin_is_refused_not_sent_as_an_empty_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """`pigeon inject --from ... --to ...` from cron, whose stdin is /dev/null: a mistake."""
    monkeypatch.setattr("sys.stdin", _Stdin(b"", terminal=False))
    with pytest.raises(ValueError, match="no message: stdin was empty"):
        _request(_args())


@pytest.mark.parametrize("terminal", [False, True])
def test_an_empty_stdin_named_with_a_dash_is_refused_as_a_piped_one(
    monkeypatch: pytest.MonkeyPatch, terminal: bool
) -> None:
    """`-` says the same as a pipe: an empty one is no message, not one sent for the node to refuse."""
    monkeypatch.setattr("sys.stdin", _Stdin(b"", terminal=terminal))
    with pytest.raises(ValueError, match="no message: stdin was empty"):
        _request(_args("-"))


def test_an_empty_message_file_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty.eml"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=f"no message: {empty} is empty"):
        _request(_args(str(empty)))


def test_parts_given_with_a_piped_stdin_leave_stdin_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A script building the message from parts, its stdin a pipe, goes on as before."""
    stdin = _Stdin(MESSAGE, terminal=False)
    monkeypatch.setattr("sys.stdin", stdin)
    request = _request(_args(subject="built", text="body"))
    assert request["content"]["subject"] == "built"
    assert stdin.buffer.tell() == 0
    with pytest.raises(ValueError, match="give either a message file"):
        _request(_args("-", subject="built"))  # both: still refused
