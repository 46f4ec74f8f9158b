"""A template that would render for hours or make gigabytes is refused at once, naming the
limit, and the node keeps serving meanwhile."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess

TOKEN = "inject-token-0123456789"
NESTED = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def _request(content: object) -> dict[str, object]:
    return {"envelope_sender": "news@example.org", "recipients": [{"email": "ann@example.net"}], "content": content}


@pytest.mark.parametrize(
    ("content", "limit"),
    [
        (f"Subject: hi\r\n\r\n{NESTED}\r\n", "loop steps"),
        ({"from": {"email": "news@example.org"}, "subject": "hi", "text": "{{ 'x' * 100000000 }}"}, "output limit"),
        (
            {
                "from": {"email": "news@example.org"},
                "subject": "hi",
                "html": "{% for i in range(99999) %}{{ 'y' * 999 }}{% endfor %}",
            },
            "message size limit",
        ),
    ],
)
def test_a_template_over_a_render_budget_is_refused_with_400_naming_the_limit_at_once(
    tmp_path: Path, content: object, limit: str
) -> None:
    config = {
        "http": {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]},
        "smtp": {"max_message_size": "10MiB"},
    }
    with PigeonProcess(tmp_path / "node", **config) as pigeon:
        started = time.monotonic()
        status, answer = pigeon.http_post("/api/v1/inject", _request(content), TOKEN)
        assert (status, limit in answer["error"]) == (400, True), answer
        assert answer["field"].startswith("$.content")
        assert time.monotonic() - started < 5
        assert pigeon.http_get("/healthz")[0] == 200
        assert not pigeon.spool_messages()
        # A reasonable loop still renders.
        fine = {
            "from": {"email": "news@example.org"},
            "subject": "hi",
            "text": "{% for i in range(3) %}{{ i }}{% endfor %}",
        }
        status, answer = pigeon.http_post("/api/v1/inject", _request(fine), TOKEN)
        assert (status, answer["accepted"]) == (200, 1), answer
