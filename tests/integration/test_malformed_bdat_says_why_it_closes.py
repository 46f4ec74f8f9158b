"""A BDAT whose size cannot be read leaves the data that follows it unframed: the session
ends, and the client hears why (501 for the command, then 421, RFC 5321 3.8) before the
connection closes, rather than finding it gone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp


@pytest.fixture(scope="module")
def pigeon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    with PigeonProcess(tmp_path_factory.mktemp("bdat") / "node") as node:
        yield node


@pytest.mark.parametrize("line", ["BDAT", "BDAT abc", "BDAT -1", "BDAT +5", "BDAT 1 2"])
def test_a_malformed_bdat_gets_501_then_421_before_the_connection_closes(pigeon: PigeonProcess, line: str) -> None:
    with RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.expect(250, "EHLO client.test")
        client.expect(250, "MAIL FROM:<a@example.org>")
        client.expect(250, "RCPT TO:<b@example.net>")
        assert client.expect(501, line) == ["5.5.4 Syntax: BDAT size [LAST]"]
        (text,) = client.expect(421)
        assert text.startswith("4.5.0 ") and "cannot tell where the data of that BDAT ends" in text
        assert client.closed_by_peer()
