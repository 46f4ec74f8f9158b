"""Template values cannot inject headers into raw content, over HTTP and through `pigeon inject`.

An outside tester's report: a recipient `name` of "Bob\\nX-Injected: yes" rendered into `To:`
reached the sink as a real (DKIM-signed) header, and "Eve\\r\\n\\r\\nfake body" ended the
header section early. Now such a request is refused whole with 400 naming the value, and a
line break in a value rendered into the body still arrives as a line break.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_cli import pigeon_cli
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

TOKEN = "inject-token-0123456789"
TOKENS = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]
RAW = "From: a@example.org\r\nTo: {{ name }} <{{ email }}>\r\nSubject: Hello {{ first|default(name) }}\r\n\r\nHi\r\n"


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PigeonProcess, ScriptedSink]]:
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint)
        with PigeonProcess(tmp_path_factory.mktemp("headers") / "node", http={"token": TOKENS}, **config) as node:
            yield node, sink


def _request(recipients: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"envelope_sender": "a@example.org", "recipients": recipients, "content": RAW, **extra}


@pytest.mark.parametrize(
    ("recipients", "shared", "field", "character"),
    [
        ([{"email": "bob@example.net", "name": "Bob\nX-Injected: yes"}], {}, "$.recipients[0].name", "LF"),
        (
            # A good recipient first: the request is still refused whole, nothing stored.
            [
                {"email": "ann@example.net", "name": "Ann"},
                {
                    "email": "eve@example.net",
                    "name": "Eve",
                    "substitutions": {"first": "Eve\r\nReply-To: attacker@evil.test"},
                },
            ],
            {},
            "$.recipients[1].substitutions.first",
            "CR",
        ),
        (
            [{"email": "eve@example.net", "name": "Eve"}],
            {"first": "Eve\r\n\r\nfake body"},
            "$.substitutions.first",
            "CR",
        ),
        ([{"email": "x@example.net", "name": "x\nFrom: ceo@bank.example"}], {}, "$.recipients[0].name", "LF"),
    ],
)
def test_a_line_break_from_a_value_into_the_header_gets_400_naming_it_and_stores_nothing(
    refusing: tuple[PigeonProcess, ScriptedSink],
    recipients: list[dict[str, Any]],
    shared: dict[str, Any],
    field: str,
    character: str,
) -> None:
    node, sink = refusing
    status, answer = node.http_post("/api/v1/inject", _request(recipients, substitutions=shared), TOKEN)
    assert status == 400, answer
    assert answer["field"] == field
    variable = field.rsplit(".", 1)[-1]
    assert answer["error"].startswith(f"template variable {variable!r}: {character} in a value rendered into")
    assert node.spool_messages() == []
    assert node.metric("pigeon_messages_received_total") == 0
    assert sink.received == []


def test_line_breaks_in_body_values_arrive_and_the_cli_refuses_header_ones_with_exit_2(tmp_path: Path) -> None:
    with ScriptedSink() as sink, PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as node:
        recipients = [{"email": "bob@example.net", "name": "Bob", "substitutions": {"note": "line 1\nline 2"}}]
        request = _request(recipients, content=RAW.replace("Hi\r\n", "Hi\r\n{{ note }}\r\n"))
        status, answer = node.http_post("/api/v1/inject", request, node.local_token)
        assert status == 200, answer
        message = tmp_path / "message.eml"
        message.write_text("From: a@example.org\nSubject: Hello {{ first }}\n\n{{ body }}\n")
        config = str(node.config_path)
        cli = ["inject", "-c", config, "--from", "a@example.org", "--to", "c@example.net", "--template", str(message)]
        sent = pigeon_cli(*cli, "--var", "first=Carol", "--var", "body=one\ntwo")
        assert sent.returncode == 0, sent.stderr
        (bob, carol) = sorted(sink.wait_for(2), key=lambda m: m.recipients[0])
        assert bob.email["To"] == "Bob <bob@example.net>" and bob.email["X-Injected"] is None
        assert bob.data.endswith(b"\r\n\r\nHi\r\nline 1\r\nline 2\r\n")
        assert carol.data.endswith(b"\r\n\r\none\r\ntwo\r\n")
        refused = pigeon_cli(*cli, "--var", "first=Eve\nReply-To: attacker@evil.test", "--var", "body=x")
        assert refused.returncode == 2, refused.stderr
        assert "$.substitutions.first" in refused.stderr and "LF in a value rendered into the header" in refused.stderr
        assert len(sink.after(0.5)) == 2  # nothing more came
