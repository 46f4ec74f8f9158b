"""Every RCPT Pigeon refuses leaves a Rejection record that names the recipient, as the client
gave it, escaped and bounded: an operator can see who was refused, and a hostile address cannot
paint the operator's terminal or fill the log."""

from __future__ import annotations

import gzip
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp


def test_every_refused_rcpt_is_logged_with_the_recipient_it_named(tmp_path: Path) -> None:
    node = PigeonProcess(
        tmp_path / "node",
        smtp={"max_recipients": 1, "relay_networks": ["127.0.0.2/32"]},  # 127.0.0.1 may not relay
    )
    with node, RawSmtp(node.smtp_port, source="127.0.0.2") as client:
        client.expect(220)
        client.expect(250, "EHLO client.test")
        client.expect(503, "RCPT TO:<early@example.net>")
        client.expect(250, "MAIL FROM:<a@example.org>")
        client.expect(250, "RCPT TO:<bob@example.net>")
        client.expect(452, "RCPT TO:<carol@example.net>")
        client.expect(553, b"RCPT TO:<evil\x1b[2J\xc2\x9b31m\xe2\x80\xaeten.elpmaxe@example..net>")
        client.expect(500, b"RCPT TO:<caf\xe9@example.net>")
        client.expect(501, "RCPT TO:<" + "x" * 900 + "@example.net>")
        client.expect(501, "RCPT TO:dave@example.net")
        with RawSmtp(node.smtp_port) as outside:  # not a relay client: refused by the listener
            outside.expect(220)
            outside.expect(250, "EHLO outside.test")
            outside.expect(250, "MAIL FROM:<c@example.com>")
            outside.expect(550, "RCPT TO:<victim@elsewhere.example>")
        rejections = node.wait_records("Rejection", 7)
    logged = [(r["command"], r["response"]["code"], r.get("sender"), r["recipients"]) for r in rejections]
    assert logged == [
        ("RCPT", 503, None, ["early@example.net"]),
        ("RCPT", 452, "a@example.org", ["carol@example.net"]),
        ("RCPT", 553, "a@example.org", ["evil\\x1b[2J\\u009b31m\\u202eten.elpmaxe@example..net"]),
        ("RCPT", 500, "a@example.org", ["caf\\xe9@example.net"]),
        ("RCPT", 501, "a@example.org", ["x" * 256 + "..."]),
        ("RCPT", 501, "a@example.org", ["dave@example.net"]),
        ("RCPT", 550, "c@example.com", ["victim@elsewhere.example"]),
    ]
    # The log file itself holds no control character a terminal would act on.
    segments = [path for path in (node.root / "log").rglob("*.jsonl*") if path.is_file()]
    raw = b"".join(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes() for p in segments)
    assert b"early@example.net" in raw
    assert b"\x1b" not in raw and "\u009b".encode() not in raw and "\u202e".encode() not in raw
