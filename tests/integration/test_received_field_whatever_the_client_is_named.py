"""Pigeon's own Received field parses whatever name the client gave in EHLO or HELO
(RFC 5321 4.4, RFC 5322 3.6.7): a name that is no domain nor address literal is taken, but
written only inside the comment, quoted, with the client's address in its place."""

from __future__ import annotations

import smtplib

from tests.support.process import PigeonProcess

_BY = b"\tby mx.pigeon.test (Pigeon) with ESMTP id "


def _received_fields(pigeon: PigeonProcess, names: list[str]) -> list[bytes]:
    """Each name's message, to its own recipient, and the Received field it was stored with."""
    for n, name in enumerate(names):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            code, _ = client.ehlo(name)
            assert code == 250
            message = f"From: a@example.org\r\nTo: r{n}@example.net\r\nSubject: hi\r\n\r\nHello.\r\n"
            assert client.sendmail("a@example.org", [f"r{n}@example.net"], message) == {}
    stored = {m["recipients"][0]: m["data"] for m in pigeon.spool_messages()}
    return [stored[f"r{n}@example.net"].split(b"From: ")[0] for n in range(len(names))]


_ODD = {
    "(x": rb"from [127.0.0.1] (helo=\(x)",
    "a)b": rb"from [127.0.0.1] (helo=a\)b)",
    "a;b": rb"from [127.0.0.1] (helo=a;b)",
    "[1.2.3.4": rb"from [127.0.0.1] (helo=[1.2.3.4)",
    "<x>": rb"from [127.0.0.1] (helo=<x>)",
    "a,b@c": rb"from [127.0.0.1] (helo=a,b@c)",
    "back\\slash(": rb"from [127.0.0.1] (helo=back\\slash\()",
}


def test_a_name_that_is_no_domain_goes_quoted_into_the_comment(pigeon: PigeonProcess) -> None:
    for n, (written, received) in enumerate(zip(_ODD.values(), _received_fields(pigeon, list(_ODD)), strict=True)):
        assert received.startswith(b"Received: " + written + b"\r\n" + _BY)
        # The client's address, Pigeon's name, the id, the recipient and the date all stay
        # outside any comment, and the only `;` outside it is the date's.
        assert f"\tfor <r{n}@example.net>; ".encode() in received


def test_a_name_real_clients_send_is_written_as_given(pigeon: PigeonProcess) -> None:
    names = ["client.test", "localhost", "my_host.example", "client.test.", "[127.0.0.1]", "[IPv6:::1]"]
    for name, received in zip(names, _received_fields(pigeon, names), strict=True):
        assert received.startswith(f"Received: from {name} ([127.0.0.1])\r\n".encode() + _BY)
