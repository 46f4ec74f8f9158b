"""A domain that is not ASCII must be valid IDNA2008 (RFC 5891 5.4) once in lower case and NFC,
at every door: 553 5.1.3 over SMTP, 400 over HTTP,
with the same text. UTS #46 mapping no longer changes where mail goes: `u@Ⅳ.example` is
refused, not delivered to `u@iv.example`. Valid IDNs and plain ASCII domains pass as before."""

from __future__ import annotations

import unicodedata

import idna
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pigeon.smtp import address
from pigeon.smtp.address import Kind

from .harness import Peer, http_problem, open_transaction


def _rcpt_reply(email: str) -> str:
    peer = Peer.start()
    open_transaction(peer, ehlo=True)
    peer.send("RSET\r\n")
    peer.send("MAIL FROM:<a@example.org> SMTPUTF8\r\n")
    return peer.send(f"RCPT TO:<{email}>\r\n")


@pytest.mark.parametrize(
    ("email", "text"),
    [
        ("u@\u2163.example", address.U_LABEL_TEXT),  # ROMAN NUMERAL FOUR: UTS #46 made it iv.example
        ("x@\uff21.example", address.U_LABEL_TEXT),  # FULLWIDTH LATIN CAPITAL LETTER A: a.example
        ("x@mail.\uff45xample", address.U_LABEL_TEXT),  # in any label
        ("u@i\u2764.ws", address.U_LABEL_TEXT),  # a symbol: IDNA2003 only
        ("u@ab--\u00fc.example", address.U_LABEL_TEXT),  # hyphens in the third and fourth place
    ],
)
def test_a_domain_that_is_no_idna2008_name_is_refused_at_every_door_with_553_or_400(email: str, text: str) -> None:
    assert address.check(email) == address.Problem(Kind.IDNA, text)
    assert _rcpt_reply(email) == f"553 5.1.3 {text}\r\n"
    assert http_problem(email) == text
    if email.isascii():
        peer = Peer.start()
        peer.send("EHLO client.test\r\n")
        assert peer.send(f"MAIL FROM:<{email}>\r\n") == f"553 5.1.7 {text}\r\n"


@pytest.mark.parametrize(
    "email",
    [
        "u@b\u00fccher.example",
        "u@B\u00dcCHER.example",  # case is mapped, as for ASCII
        "u@bu\u0308cher.example",  # NFD: the same characters
        "u@\u4f8b\u3048.\u30c6\u30b9\u30c8",  # 例え.テスト
        "u@stra\u00dfe.de",
        "u@xn--bcher-kva.example",
        "u@XN--BCHER-KVA.example",
        "u@xn--r8jz45g.xn--zckzah",  # 例え.テスト as A-labels
        "u@example.com",
        "u@a--b.example",  # ASCII with hyphens: no A-label
        # ASCII goes out as written: whether it names a domain is the DNS's answer
        "u@xn--ls8h.la",  # an emoji's A-label (IDNA2003), a registered domain with an MX
        "u@xn--a.example",  # decodes to nothing IDNA2008 takes, but maps to nothing else either
        "u@\u0130stanbul.tr",
    ],
)
def test_a_valid_internationalized_or_ascii_domain_passes_at_every_door(email: str) -> None:
    assert address.check(email) is None
    assert _rcpt_reply(email) == "250 2.1.5 Recipient ok\r\n"
    assert http_problem(email) is None


@given(st.text(st.characters(min_codepoint=0x41, max_codepoint=0x2FFFF), min_size=1, max_size=12))
@example("\u2163")  # ROMAN NUMERAL FOUR: refused, where UTS #46 would deliver it to "iv"
@example("a\u03a3")  # GREEK CAPITAL LETTER SIGMA last: σ, as UTS #46 maps it, not the final ς
def test_a_domain_taken_is_delivered_to_the_name_written_never_a_mapped_one(label: str) -> None:
    """What is taken goes where it says: its A-label is the IDNA2008 encoding of the label as
    written, each character in lower case, in NFC; never what UTS #46 would map it to."""
    email = f"u@{label}.example"
    if address.check(email) is not None or label.isascii():
        return
    lowered = "".join(char.lower() for char in label)
    strict = idna.encode(unicodedata.normalize("NFC", lowered), uts46=False).decode("ascii")
    assert address.a_label(f"{label}.example") == f"{strict}.example"
