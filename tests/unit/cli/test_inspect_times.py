"""`pigeon inspect` shows each time as a date and its Unix time: both are the same whole second.
Found from outside: `created 2026-12-07 09:15:07 UTC (1796634908)`, the date cut to its second
and the Unix time rounded to the nearest."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from pigeon.cli import admin


class _Api:
    answer: Any = None

    def __init__(self, args: argparse.Namespace) -> None:
        self.url = "http://127.0.0.1:8025"

    def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        return 200, self.answer


def test_inspect_shows_a_date_and_its_unix_time_as_the_same_second(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(admin, "ApiClient", _Api)
    _Api.answer = {"id": "0382610d06800000", "queue": "@x.test", "sender": "a@example.org",
                   "recipients": ["b@x.test"], "attempts": 1, "created": 1796634907.6,
                   "next_due": 1796634967.5, "held_until": 1796635027.0}  # fmt: skip
    args = argparse.Namespace(json=False, cluster=False, headers=False, content=False, id="0382610d06800000")
    assert admin._inspect(args) == 0
    shown = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert shown["created"] == "2026-12-07 09:15:07 UTC (1796634907)"
    assert shown["next_due"] == "2026-12-07 09:16:07 UTC (1796634967)"
    assert shown["held_until"] == "2026-12-07 09:17:07 UTC (1796635027)"
