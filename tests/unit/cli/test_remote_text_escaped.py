"""What a remote server, a sender or an API client chose to write reaches the operator's terminal
escaped: `pigeon inspect`, `queue summary`, `suspend --list`, `top`, `shaping status`, an
error, `pigeon logs`. A sink answering `451 4.7.1 later ESC]0;pwned BEL ESC[2J` must not retitle
or clear the screen."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import pytest

from pigeon.cli import admin, logs, shaping, top
from pigeon.cli.api import fail

NASTY = "later \x1b]0;pwned\x07\x1b[2J \u009b31m \u202eevil cleared"
SHOWN = "later \\x1b]0;pwned\\x07\\x1b[2J \\u009b31m \\u202eevil cleared"


def _no_controls(text: str) -> None:
    # Line breaks are the table's own; nothing else a terminal acts on may be there.
    assert all(char.isprintable() for char in text.replace("\n", "")), repr(text)


class _Api:
    """Stands in for `ApiClient`: answers every request with `answer`."""

    answer: Any = None
    status = 200

    def __init__(self, args: argparse.Namespace) -> None:
        self.url = "http://127.0.0.1:8025"

    def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        return self.status, self.answer


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> type[_Api]:
    for module in (admin, shaping):
        monkeypatch.setattr(module, "ApiClient", _Api)
    _Api.status = 200
    return _Api


def _args(**more: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"json": False, "cluster": False, "headers": False, "content": False, **more})


def _rule(reason: str) -> dict[str, Any]:
    return {"id": "3f9a1c2b7d4e", "kind": "suspend", "selector": {"domain": "x.test"}, "created": 1.0,
            "reason": reason, "operator": "ops", "via": "api"}  # fmt: skip


def test_inspect_escapes_the_remote_servers_last_response(api: type[_Api], capsys: pytest.CaptureFixture[str]) -> None:
    api.answer = {"id": "0382610d06800000", "queue": "@x.test", "sender": "a@example.org",
                  "recipients": ["b@x.test", "c@x.test"], "attempts": 1, "created": 1.7e9,
                  "last_response": f"451 4.7.1 {NASTY}", "metadata": {"note": NASTY}}  # fmt: skip
    assert admin._inspect(_args(id="0382610d06800000")) == 0
    out = capsys.readouterr().out
    _no_controls(out)
    assert f"last_response  451 4.7.1 {SHOWN}\n" in out
    assert f"metadata       note={SHOWN}\n" in out
    assert "recipients     b@x.test, c@x.test\n" in out


def test_inspect_json_is_the_answer_as_it_is(api: type[_Api], capsys: pytest.CaptureFixture[str]) -> None:
    api.answer = {"id": "0382610d06800000", "last_response": f"451 4.7.1 {NASTY}"}
    assert admin._inspect(_args(id="0382610d06800000", json=True)) == 0
    out = capsys.readouterr().out
    _no_controls(out)  # JSON escapes it its own way, and a script reads back the very text
    assert json.loads(out)["last_response"] == f"451 4.7.1 {NASTY}"


def test_queue_summary_escapes_queue_names_and_suspension_reasons(
    api: type[_Api], capsys: pytest.CaptureFixture[str]
) -> None:
    row = {"queue": "c1:@x.test", "messages": 3, "due": 0, "held": 0, "suspended": 3, "ready": 0, "in_flight": 0,
           "oldest": time.time(), "suspended_by": [_rule(NASTY)]}  # fmt: skip
    ready = {"path": "mx.x.test", "site": "mx.x.test", "queued": 0, "connections": 0, "provider": None,
             "effects": [], "suspended_by": [_rule(NASTY)]}  # fmt: skip
    api.answer = {"scheduled": [row], "ready": [ready]}
    assert admin._queue_summary(_args()) == 0
    out = capsys.readouterr().out
    _no_controls(out)
    assert out.count(f"ops via api: {SHOWN} (rule 3f9a1c2b7d4e)") == 2


def test_suspend_list_escapes_the_reason_given(api: type[_Api], capsys: pytest.CaptureFixture[str]) -> None:
    api.answer = {"rules": [_rule(NASTY)]}
    assert admin._suspend(_args(list=True)) == 0
    out = capsys.readouterr().out
    _no_controls(out)
    assert out.rstrip("\n").endswith(f"by ops via api: {SHOWN}")


def test_an_error_answer_is_escaped_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert fail(400, {"error": f"no queue {NASTY!s}", "field": "$.queue"}) == 2
    err = capsys.readouterr().err
    _no_controls(err)
    assert f"no queue {SHOWN} ($.queue)" in err


def test_top_escapes_a_mailboxs_error_and_the_queue_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # (lines are cut at the terminal's width)
    frame = {"url": "http://127.0.0.1:8025", "time": time.time(), "rates": {"received": 0.0},
             "spool_messages": 1, "smtp_connections": {"in": 0, "out": 0},
             "queues": {"scheduled": [{"queue": "c1:@x.test", "messages": 1, "due": 0, "held": 0, "suspended": 0}],
                        "ready": [], "missing": [{"worker": 1, "error": NASTY}]},
             "inbound": {"rates": {"delivered": 0.0}, "mailboxes": {"box": {"target": "t", "status": "down",
                                                                            "error": NASTY}}}}  # fmt: skip
    screen = top._screen(frame)
    _no_controls(screen)
    assert "\\x1b]0;pwned" in screen


def test_shaping_status_escapes_the_reply_that_started_an_effect(
    api: type[_Api], capsys: pytest.CaptureFixture[str]
) -> None:
    effect = {"id": "3f9a0c1b2d4e", "rule": "gmail-421", "key": "mx.x.test", "action": "suspend",
              "created": time.time(), "expires_at": time.time() + 60, "reply": f"421 4.7.0 {NASTY}",
              "node": "n1"}  # fmt: skip
    api.answer = {"mode": "node", "effects": [effect]}
    assert shaping.run_status(_args()) == 0
    out = capsys.readouterr().out
    _no_controls(out)
    assert f"421 4.7.0 {SHOWN}" in out


def test_logs_escape_del_c1_and_bidi_characters_as_json_escapes() -> None:
    record = {"type": "TransientFailure", "response": {"text": "a\x7fb\u009b31m\u202ec ok \U000e0001 j\u00fcrgen"}}
    line = json.dumps(record, ensure_ascii=False).encode()
    shown = logs._printable(line)
    _no_controls(shown.decode())
    assert json.loads(shown) == record  # the same record to jq
    assert "j\u00fcrgen" in shown.decode()  # printable letters stay as they are
    plain = json.dumps({"type": "Reception", "id": "1"}).encode()
    assert logs._printable(plain) is plain
