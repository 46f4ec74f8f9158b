"""`pigeon inject` given a whole message (a file, or stdin as sendmail reads it) sends it as it
is: it was rendered as a Jinja2 template, so `{# ... #}` and `{% raw %}` text was dropped
without a word and a `{{ code }}` refused the message with `'code' is undefined`. `--template`
asks for rendering (`--no-template` is still taken), and a raw template's error says how to
send it as it is (README, "HTTP API and operator commands")."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess

TOKEN = "whole-token-0123456789abcdef"
MESSAGE = (
    b"From: news@example.org\nTo: ann@example.net\nSubject: test {#42#}\nMessage-ID: <tmplcheck1@example.org>\n\n"
    b"We are the {# 1 #} seller.\n{% raw %}kept{% endraw %}\nYour code: {{ code }}\n"
)
"""The outside tester's message, with a `{{ code }}` too."""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    """Delivery off: what is taken stays in the spool, to be read."""
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    with PigeonProcess(tmp_path_factory.mktemp("whole") / "node", http=http) as node:
        yield node


def _inject(node: PigeonProcess, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    command = ["inject", "-c", str(node.config_path), "--token", TOKEN]
    command += ["--from", "news@example.org", *args]
    return zygote.run(command, input=stdin, timeout=60, check=False)


def _stored(node: PigeonProcess, recipient: str) -> bytes:
    (message,) = [m for m in node.spool_messages() if m["recipients"] == [recipient]]
    data: bytes = message["data"]
    return data


@pytest.mark.parametrize("source", ["piped", "dash", "file", "file --no-template"])
def test_a_whole_message_is_sent_as_it_is(node: PigeonProcess, tmp_path: Path, source: str) -> None:
    recipient = f"{source.replace(' --', '-')}@example.net"
    path = tmp_path / "message.eml"
    path.write_bytes(MESSAGE)
    given = {
        "piped": ([], MESSAGE),
        "dash": (["-"], MESSAGE),
        "file": ([str(path)], None),
        "file --no-template": (["--no-template", str(path)], None),
    }
    options, stdin = given[source]
    done = _inject(node, "--to", recipient, *options, stdin=stdin)
    assert done.returncode == 0, done
    assert _stored(node, recipient).endswith(MESSAGE.replace(b"\n", b"\r\n"))


def test_template_renders_a_whole_message(node: PigeonProcess) -> None:
    message = b"From: news@example.org\nSubject: code {{ code }}\n\n{# gone #}Your code: {{ code }}\n"
    done = _inject(node, "--to", "rendered@example.net", "--template", "--var", "code=A-1", stdin=message)
    assert done.returncode == 0, done
    assert _stored(node, "rendered@example.net").endswith(b"Subject: code A-1\r\n\r\nYour code: A-1\r\n")


def test_a_template_error_of_a_whole_message_names_the_flag(node: PigeonProcess) -> None:
    done = _inject(node, "--to", "undefined@example.net", "--template", stdin=MESSAGE)
    assert done.returncode == 1, done
    assert done.stdout.decode().split(None, 2) == [
        "undefined@example.net",
        "refused:",
        "554 5.6.0 template raw: 'code' is undefined (raw content is rendered as a Jinja2 template:"
        ' "template": false, or pigeon inject without --template, sends it as it is)\n',
    ]


def test_a_template_syntax_error_of_a_whole_message_names_the_flag(node: PigeonProcess) -> None:
    done = _inject(node, "--to", "syntax@example.net", "--template", stdin=b"Subject: {{ x\n\nbody\n")
    assert done.returncode == 2, done
    assert "without --template, sends it as it is" in done.stderr.decode(), done


def test_var_without_template_for_a_whole_message_is_a_usage_error(node: PigeonProcess) -> None:
    """Rather than `{{ code }}` sent as it is, which the sender meant filled in."""
    before = len(node.spool_messages())
    done = _inject(node, "--to", "var@example.net", "--var", "code=1", stdin=MESSAGE)
    assert done.returncode == 2, done
    assert done.stderr.decode() == (
        "pigeon inject: --var sets a template variable, but a message file (or stdin) is sent as it is:"
        " add --template to render it as a Jinja2 template\n"
    )
    assert len(node.spool_messages()) == before


def test_parts_are_still_templates(node: PigeonProcess) -> None:
    done = _inject(node, "--to", "parts@example.net", "--subject", "s", "--text", "code {{ code }}", "--var", "code=9")
    assert done.returncode == 0, done
    assert b"code 9" in _stored(node, "parts@example.net")


def test_the_api_names_template_false_for_a_raw_template_error(node: PigeonProcess) -> None:
    request = {
        "envelope_sender": "news@example.org",
        "recipients": [{"email": "api@example.net"}],
        "content": MESSAGE.decode(),
    }
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert status == 422, answer
    error = answer["recipients"][0]["error"]
    assert error.endswith('"template": false, or pigeon inject without --template, sends it as it is)'), error
