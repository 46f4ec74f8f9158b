"""An HTTP request's session id is unique across a node's workers, as an SMTP session's is: its
records (Reception, Rejection) can be traced back to that one request, whichever worker took it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.process import PigeonProcess

TOKEN = "session-token-0123456789"
_SESSION = re.compile(r"http-[0-9a-f]{8}[0-9a-f]{6,}")


def _request(email: str) -> dict[str, object]:
    return {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": email}],
        "content": "From: a@example.org\nSubject: hi\n\nhello\n",
        "template": False,
    }


def test_requests_through_two_workers_never_share_a_session_id(tmp_path: Path) -> None:
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    with PigeonProcess(tmp_path / "node", node={"workers": 2}, http=http) as pigeon:
        # The supervisor hands requests to the workers in turn: each worker takes three.
        for n in range(6):
            status, answer = pigeon.http_post("/api/v1/inject", _request(f"r{n}@example.net"), TOKEN)
            assert (status, answer["accepted"]) == (200, 1), answer
        for _ in range(2):
            assert pigeon.http_post("/api/v1/inject", _request("not an address"), TOKEN)[0] == 400
        receptions = pigeon.wait_records("Reception", 6)
        rejections = pigeon.wait_records("Rejection", 2)
        sessions = [r["session"] for r in receptions + rejections]
        assert len(set(sessions)) == 8, sorted(sessions)
        assert all(_SESSION.fullmatch(session) for session in sessions), sessions
        # Both workers answered (their prefixes differ), so a count alone would have repeated.
        assert len({session[:13] for session in sessions}) == 2, sessions
