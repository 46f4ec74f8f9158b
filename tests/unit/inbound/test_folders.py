"""Folder names in modified UTF-7 (RFC 3501 5.1.3): the RFC's examples, and round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pigeon.inbound.folders import decode, encode, to_imap

# Text without lone surrogates: what a TOML config or a server's UTF-16 can hold.
_NAMES = st.text(st.characters(exclude_categories=("Cs",)))


@pytest.mark.parametrize(
    ("text", "wire"),
    [
        ("INBOX", "INBOX"),
        ("Entrée/Reçus", "Entr&AOk-e/Re&AOc-us"),
        ("R&D", "R&-D"),
        ("~peter/mail/台北/日本語", "~peter/mail/&U,BTFw-/&ZeVnLIqe-"),  # RFC 3501's own example
        ("📬", "&2D3c7A-"),  # outside the BMP: a surrogate pair (D83D DCEC)
        ("a\tb", "a&AAk-b"),  # a control character is shifted, never sent raw
    ],
)
def test_names_are_encoded_as_rfc_3501_spells_them(text: str, wire: str) -> None:
    assert encode(text) == wire
    assert decode(wire) == text


@given(_NAMES)
def test_any_name_survives_a_round_trip(name: str) -> None:
    wire = encode(name)
    assert wire.isascii() and all(" " <= char <= "~" for char in wire)
    assert decode(wire) == name


@given(_NAMES)
def test_a_configured_name_reaches_the_wire_encoded_exactly_once(name: str) -> None:
    wire = to_imap(name)
    assert to_imap(wire) == wire  # an already encoded name is sent as it is
    assert decode(wire) == name or wire == name


def test_a_name_written_in_modified_utf7_in_the_config_is_sent_unchanged() -> None:
    assert to_imap("Entr&AOk-e/Re&AOc-us") == "Entr&AOk-e/Re&AOc-us"
    assert to_imap("Entrée/Reçus") == "Entr&AOk-e/Re&AOc-us"
    assert to_imap("Q&A") == "Q&-A"  # "&A" is no shifted run: the name's own "&"


@pytest.mark.parametrize("wire", ["&AOk", "&A-", "&AOkAZQ-", "&Jjo!-", "&2D0-", "caf\u00e9", "&ZQ-"])
def test_names_that_are_not_modified_utf7_are_refused(wire: str) -> None:
    with pytest.raises(ValueError, match="not modified UTF-7"):
        decode(wire)
