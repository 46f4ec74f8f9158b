"""`[smtp] banner` and `[delivery] dsn_from` go on the wire as Pigeon writes them: a value that
would break the greeting (a line break starts a reply nobody asked for) or a DSN's header (no
mailbox, or one a 7-bit hop cannot take) is refused at load, naming the file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pigeon.config.load import ConfigError, load
from pigeon.config.schema import Config


def load_text(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "pigeon.toml"
    path.write_text(text)
    return load(path)


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, text)
    return str(caught.value)


BAD_BANNERS = {
    "crlf": ('"ESMTP\\r\\n250 fake"', "holds a line break, a control character"),
    "lf": ('"ESMTP\\nnext"', "holds a line break, a control character"),
    "tab": ('"ESMTP\\tPigeon"', "holds a line break, a control character"),
    "nul": ('"ESMTP\\u0000"', "holds a line break, a control character"),
    "non-ascii": ('"ESMTP Pigeön"', "not ASCII"),
    "leading-space": ('" ESMTP"', "starts or ends with a space"),
    "too-long": (f'"{"x" * 500}"', "RFC 5321 4.5.3.1.5 allows 512"),
}


@pytest.mark.parametrize("bad", BAD_BANNERS, ids=list(BAD_BANNERS))
def test_a_banner_that_would_break_the_greeting_is_refused_at_load(tmp_path: Path, bad: str) -> None:
    value, why = BAD_BANNERS[bad]
    message = error_of(tmp_path, f'[smtp]\nhostname = "mx.example.org"\nbanner = {value}\n')
    assert message.startswith(f"{tmp_path / 'pigeon.toml'}, line 3: [smtp] banner: ")
    assert why in message


@pytest.mark.parametrize("banner", ["ESMTP", "ESMTP ready", "", "Welcome; no UCE (see https://example.org/policy)"])
def test_a_printable_banner_loads(tmp_path: Path, banner: str) -> None:
    config = load_text(tmp_path, f'[smtp]\nbanner = "{banner}"\n')
    assert config.smtp.banner == banner


def test_the_banner_defaults_to_esmtp_pigeon(tmp_path: Path) -> None:
    assert load_text(tmp_path, "").smtp.banner == "ESMTP Pigeon"


BAD_DSN_FROM = {
    "no-domain": ('"MAILER-DAEMON"', "is not a mailbox"),
    "display-name": ('"Mail Delivery <MAILER-DAEMON@example.com>"', "is not a mailbox"),
    "crlf": ('"MAILER-DAEMON@example.com\\r\\nBcc: x@evil.test"', "is not a mailbox"),
    "utf8-local-part": ('"dämon@example.com"', "has a local part that is not ASCII"),
    "bad-domain": ('"MAILER-DAEMON@exa mple.com"', "is not a mailbox"),
}


@pytest.mark.parametrize("bad", BAD_DSN_FROM, ids=list(BAD_DSN_FROM))
def test_a_dsn_from_that_is_no_ascii_mailbox_is_refused_at_load(tmp_path: Path, bad: str) -> None:
    value, why = BAD_DSN_FROM[bad]
    message = error_of(tmp_path, f"[delivery]\ndsn_from = {value}\n")
    assert message.startswith(f"{tmp_path / 'pigeon.toml'}, line 2: [delivery] dsn_from: ")
    assert why in message
    assert "it is the From address of Pigeon's DSNs" in message


def test_a_dsn_from_longer_than_a_line_is_refused_at_load(tmp_path: Path) -> None:
    address = f"MAILER-DAEMON@{'a' * 60}.{'b' * 60}.example"
    message = error_of(tmp_path, f'[smtp]\nmax_line_length = 100\n[delivery]\ndsn_from = "{address}"\n')
    assert "line 4: [delivery] dsn_from: " in message
    assert "does not fit on a line of [smtp] max_line_length (100) octets" in message


@pytest.mark.parametrize(
    "address", ["MAILER-DAEMON@example.com", "bounces@bücher.example", "mailer-daemon@[192.0.2.1]"]
)
def test_a_mailbox_loads_as_dsn_from(tmp_path: Path, address: str) -> None:
    assert load_text(tmp_path, f'[delivery]\ndsn_from = "{address}"\n').delivery.dsn_from == address
