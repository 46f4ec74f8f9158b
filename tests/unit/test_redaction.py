"""Credentials in configured URLs and DSNs are masked wherever the text names them; the host stays."""

from __future__ import annotations

import logging

import pytest

from pigeon.redaction import RedactingFormatter, masked, redact, redact_headers, redact_url


@pytest.mark.parametrize(
    ("secret_bearing", "shown"),
    [
        ("redis://:hunter2@127.0.0.1:6399/0", "redis://:***@127.0.0.1:6399/0"),
        ("rediss://default:p@ss@redis.example:6380/1", "rediss://default:***@redis.example:6380/1"),
        ("postgresql://app:s3cret@db.example:5432/mail", "postgresql://app:***@db.example:5432/mail"),
        (
            "postgres://db.example/mail?sslpassword=x&application_name=p",
            "postgres://db.example/mail?sslpassword=***&application_name=p",
        ),
        ("https://bob:pw@hooks.example/in?token=abc&page=2", "https://bob:***@hooks.example/in?token=***&page=2"),
        (
            "https://hooks.example/in?api_key=abc#access_token=z",
            "https://hooks.example/in?api_key=***#access_token=***",
        ),
        ("https://ghp_0123456789@hooks.example/in", "https://***@hooks.example/in"),
        ("https://hooks.example/in?page=2", "https://hooks.example/in?page=2"),
        (  # Azure Functions' function key
            "https://app.azurewebsites.example/api/fn?code=aZ3kq9XwPl0m&name=x",
            "https://app.azurewebsites.example/api/fn?code=***&name=x",
        ),
        ("https://hooks.example/in#aZ3kq9XwPl0mN7vB", "https://hooks.example/in#***"),  # a bare fragment
        (
            "https://hooks.slack.example/services/T0A1B2C3D/B0A1B2C3D/aZ3kq9XwPl0mN7vB2cD4eF6g",
            "https://hooks.slack.example/services/T0A1B2C3D/B0A1B2C3D/***",
        ),
        (
            "https://discord.example/api/webhooks/123456789012345678/Ab-3dEf_9hIjKlMnOpQrStUv?wait=true",
            "https://discord.example/api/webhooks/123456789012345678/***?wait=true",
        ),
        (
            "https://hooks.example/v1/mail-received/notifications",
            "https://hooks.example/v1/mail-received/notifications",
        ),
    ],
)
def test_a_url_keeps_its_host_and_loses_its_credentials(secret_bearing: str, shown: str) -> None:
    assert redact_url(secret_bearing) == shown
    assert redact(f"Redis at {secret_bearing}: Error 111 connecting") == f"Redis at {shown}: Error 111 connecting"


@pytest.mark.parametrize(
    ("secret_bearing", "shown"),
    [
        ("redis://:REDIS SECRET7@127.0.0.1:41391/0", "redis://:***@127.0.0.1:41391/0"),  # a space
        ("redis://:SEC/RET11@127.0.0.1/0", "redis://:***@127.0.0.1/0"),  # base64's "/"
        ("postgresql://app:SE#CR?ET@db.example:5432/mail", "postgresql://app:***@db.example:5432/mail"),
        ("https://bob:S/E?C#R@E@T@hooks.example/in?page=2", "https://bob:***@hooks.example/in?page=2"),
        ("redis://:a@/b@cache.example:6380/0", "redis://:***@cache.example:6380/0"),  # "@/" then "@host"
        ("https://bob:SE/CRET@[::1]:8443/in", "https://bob:***@[::1]:8443/in"),
    ],
)
def test_a_password_holding_what_ends_a_host_goes_whole(secret_bearing: str, shown: str) -> None:
    assert redact_url(secret_bearing) == shown


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example/users/@me",
        "https://hooks.example:8443/users/@me",
        "https://hooks.example/notify?to=ops@example.com",
        "unix:///run/redis.sock?db=2",
        "redis://host:port",
    ],
)
def test_an_at_sign_after_a_host_is_the_paths_and_stays(url: str) -> None:
    assert redact_url(url) == url


def test_config_headers_keep_only_a_harmless_fields_value() -> None:
    headers = {"X-Credentials": "c", "X-Jwt": "j", "Sessionid": "s", "content-type": "text/plain", "User-Agent": "u"}
    assert redact_headers(headers) == {
        "X-Credentials": "***",
        "X-Jwt": "***",
        "Sessionid": "***",
        "content-type": "text/plain",
        "User-Agent": "u",
    }


def test_a_keyword_dsn_loses_its_password_quoted_or_not() -> None:
    assert redact("host=db.example user=app password='s3 cret' dbname=mail") == (
        "host=db.example user=app password=*** dbname=mail"
    )
    assert redact("host=db.example password=s3cret") == "host=db.example password=***"


def test_a_url_is_found_wherever_its_run_of_scheme_characters_begins() -> None:
    assert redact("id 42redis://:pw@r:1/0 and x.y-http://u:pw@h/") == "id 42redis://:***@r:1/0 and x.y-http://u:***@h/"
    assert redact("a.b+c" * 5 + "://u:pw@h =x") == "a.b+c" * 5 + "://u:***@h =x"


def test_text_without_credentials_is_left_as_it_is() -> None:
    for text in ("dedupe_key=3f9a key=3 x=1", "451 4.3.0 hook: 503 Service Unavailable", "mailbox support: ok"):
        assert redact(text) == text


def test_a_log_line_and_its_traceback_are_redacted() -> None:
    try:
        raise ValueError("cannot parse postgresql://app:s3cret@db.example/mail")
    except ValueError:
        record = logging.LogRecord("t", logging.ERROR, __file__, 1, "target %s", ("redis://:pw@r:1",), None)
        import sys

        record.exc_info = sys.exc_info()
    line = RedactingFormatter("%(message)s").format(record)
    assert "s3cret" not in line and ":pw@" not in line
    assert "db.example" in line and "redis://:***@r:1" in line


def _line(message: str, *args: object) -> str:
    formatter = RedactingFormatter("%(asctime)s w0 %(levelname)s %(name)s: %(message)s")
    return formatter.format(logging.LogRecord("pigeon.x", logging.WARNING, __file__, 1, message, args, None))


def test_a_log_line_carries_no_control_or_bidi_character_from_others() -> None:
    reply = "451 4.7.1 later \x1b]0;title\x07\u202e gnp.exe"
    effect = _line("shaping effect %s: %s (rule %s, from %s: %s)", "e1", "suspend site:mx", "r", "n1", reply)
    assert effect.endswith(r"from n1: 451 4.7.1 later \x1b]0;title\x07\u202e gnp.exe)")
    suspend = _line("admin suspend by %s of %s (%s)", "ops", "queue q\x00x", "evil \u001b]0;T\u0007\u202e\nFORGED line")
    assert suspend.endswith(r"admin suspend by ops of queue q\x00x (evil \x1b]0;T\x07\u202e\x0aFORGED line)")
    for line in (effect, suspend):
        assert line.isprintable(), line  # one line, nothing a terminal acts on
    already_shown = _line("refused RCPT %s", r"<a\x1bb@example.net>")  # escaped once (`shown`), not twice
    assert already_shown.endswith(r"refused RCPT <a\x1bb@example.net>")


def test_a_traceback_keeps_its_line_breaks_and_loses_its_controls() -> None:
    try:
        raise ValueError("reply \x1b[2J\u202e from redis://:pw@r:1")
    except ValueError:
        import sys

        record = logging.LogRecord("t", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    text = RedactingFormatter("%(message)s").format(record)
    first, *trace = text.split("\n")
    assert first == "failed" and trace[0] == "Traceback (most recent call last):"
    assert trace[-1] == r"ValueError: reply \x1b[2J\u202e from redis://:***@r:1"
    assert all(line.isprintable() for line in trace)


@pytest.mark.parametrize(
    ("url", "is_masked"),
    [
        ("redis://:***@127.0.0.1:6379/0", True),
        ("postgresql://app:***@db:5432/mail", True),
        ("https://***@hooks.example/in", True),
        ("https://hooks.example/services/T01/B02/***", True),
        ("https://app.example/in?token=***&page=2", True),
        ("https://app.example/in#***", True),
        ("host=db password=*** dbname=mail", True),
        ("redis://:pass***word@127.0.0.1:6379/0", False),  # a password that holds asterisks
        ("https://app.example/a***b", False),
        ("https://app.example/in?page=***", False),  # (no secret's place)
        ("https://app.example/in?token=abc&sig=***", False),  # (a secret of its own: not config show's)
        ("redis://127.0.0.1:6379/0", False),
    ],
)
def test_masked_tells_a_url_as_config_show_prints_it_from_one_with_its_secrets(url: str, is_masked: bool) -> None:
    assert masked(url) is is_masked
