"""`pigeon bounce` is Postfix's `postsuper -d`: each recipient is written off with an `AdminBounce`
record, and the sender gets no DSN. Someone used to other MTAs reads "bounce" as "the sender is
told", so the help and the admin API's description say otherwise (an outside tester found that
`pigeon bounce --help` said only "Bounce queued mail")."""

from __future__ import annotations

import pytest

from pigeon.cli.main import main
from pigeon.listener.http.openapi import document


def _unwrapped(text: str) -> str:
    return " ".join(text.split())


def test_bounce_help_says_the_recipients_get_adminbounce_records_and_the_sender_no_dsn(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bounce", "--help"])
    assert exited.value.code == 0
    shown = _unwrapped(capsys.readouterr().out)
    description = shown.partition("Bounce ")[2]
    assert "AdminBounce record" in description.partition("options:")[0]
    assert "no DSN" in description.partition("options:")[0]
    assert "postsuper -d" in shown


def test_the_command_list_says_a_bounce_sends_no_dsn(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("bounce ")]
    assert "no DSN" in line


def test_the_admin_apis_bounce_says_the_sender_gets_no_dsn() -> None:
    bounce = document()["paths"]["/api/v1/admin/bounce"]["post"]
    said = _unwrapped(f"{bounce['summary']} {bounce.get('description', '')}")
    assert "no DSN" in said and "AdminBounce record" in said
