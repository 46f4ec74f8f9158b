"""Every MAIL Pigeon refuses leaves a Rejection record that names the sender it gave, as a
refused RCPT names its recipient and an injection's refusal its sender: an operator can see
whose mail was turned away, whoever refused it (the policy's on_mail_from, the SIZE limit,
the parser, the order of commands)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp

POLICY = """
    import asyncio
    from pigeon.policy import Refuse
    async def on_mail_from(mail):
        if mail.sender.startswith("slow-blocked@"):
            await asyncio.sleep(0.05)
            return Refuse(550, "blocked later")
        if mail.sender.startswith("blocked@"):
            return Refuse(550, "blocked")
"""


def test_every_refused_mail_is_logged_with_the_sender_it_gave(tmp_path: Path) -> None:
    module = tmp_path / "policy_mail.py"
    module.write_text(textwrap.dedent(POLICY))
    node = PigeonProcess(tmp_path / "node", policy={"module": str(module)}, smtp={"max_message_size": "10MiB"})
    with node, RawSmtp(node.smtp_port) as client:
        client.expect(220)
        client.expect(503, "MAIL FROM:<early@example.org>")
        client.expect(250, "EHLO client.test")
        client.expect(550, "MAIL FROM:<blocked@example.org>")
        client.expect(550, "MAIL FROM:<slow-blocked@example.org>")
        client.expect(552, "MAIL FROM:<big@example.org> SIZE=999999999999")
        client.expect(501, b"MAIL FROM:<evil\x1b[2J@example.org> BODY=")
        client.expect(250, "MAIL FROM:<ok@example.org>")
        client.expect(503, "MAIL FROM:<again@example.org>")
        rejections = node.wait_records("Rejection", 6)
    logged = [(r["command"], r["response"]["code"], r.get("sender")) for r in rejections]
    assert logged == [
        ("MAIL", 503, "early@example.org"),
        ("MAIL", 550, "blocked@example.org"),
        ("MAIL", 550, "slow-blocked@example.org"),
        ("MAIL", 552, "big@example.org"),
        ("MAIL", 501, "evil\\x1b[2J@example.org"),
        ("MAIL", 503, "again@example.org"),  # a second MAIL: the one refused, not the open one
    ]
