"""A policy's refusal text reaches the client as SMTP can carry it, at the SMTP and HTTP doors
alike: a long text as a multi-line reply whose every line fits RFC 5321's 512 octets, and a text
no reply can carry (not ASCII, a word longer than a line) as the hook's failure, never sent raw."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp

MESSAGE = "From: <sender@example.org>\r\nSubject: hello\r\n\r\nHello.\r\n"
# Prose of 2,000-odd characters: the reason a hook may well want to give in full.
PROSE = " ".join(f"reason{n:03d} is that this mailbox takes no mail from you;" for n in range(40))
POLICY = """
    from pigeon.policy import Refuse
    PROSE = {prose!r}
    def on_rcpt_to(rcpt):
        local = rcpt.recipient.partition("@")[0]
        if local == "prose":
            return Refuse(550, PROSE, "5.7.26")
        if local == "word":
            return Refuse(550, "x" * 2000)
        if local == "utf8":
            return Refuse(550, "nön ascii")
"""
FAILED = "451 4.3.0 policy error; try again later"


def _node(root: Path) -> PigeonProcess:
    root.mkdir(parents=True, exist_ok=True)
    module = root / "policy.py"
    module.write_text(textwrap.dedent(POLICY.format(prose=PROSE)))
    return PigeonProcess(root / "node", policy={"module": str(module)})


def test_a_long_refusal_is_a_multi_line_reply_and_one_smtp_cannot_carry_is_the_hooks_failure(tmp_path: Path) -> None:
    with _node(tmp_path) as pigeon, RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.command("EHLO client.test")
        client.expect(250, "MAIL FROM:<sender@example.org>")
        code, lines = client.command("RCPT TO:<prose@example.net>")
        assert code == 550 and len(lines) > 1
        # Each line as it was on the wire: "550-" or "550 ", its text, CRLF.
        assert all(len(f"550-{line}\r\n".encode()) <= 512 for line in lines), [len(line) for line in lines]
        assert all(line.startswith("5.7.26 ") for line in lines)
        assert " ".join(line.removeprefix("5.7.26 ") for line in lines) == PROSE
        for local in ("word", "utf8"):
            code, lines = client.command(f"RCPT TO:<{local}@example.net>")
            assert (code, lines) == (451, ["4.3.0 policy error; try again later"]), local
        failures = {f["error"].split(":", 1)[0]: f for f in pigeon.wait_records("PolicyFailure", 2)}
        assert set(failures) == {"ValueError"}  # both, each naming its problem:
        errors = sorted(f["error"] for f in pigeon.records("PolicyFailure"))
        assert "a word of 2000 characters" in errors[0] and "512 octets (RFC 5321 4.5.3.1.5)" in errors[0]
        assert "must be printable ASCII" in errors[1] and "'nön ascii'" in errors[1]
        assert all(f["action"] == "451 4.3.0" and f["hook"] == "on_rcpt_to" for f in pigeon.records("PolicyFailure"))

        # The same answers at the HTTP door: the whole text, or the hook's failure.
        def inject(*emails: str) -> tuple[int, Any]:
            body = {"envelope_sender": "sender@example.org", "recipients": [{"email": e} for e in emails]}
            return pigeon.http_post("/api/v1/inject", {**body, "content": MESSAGE}, pigeon.local_token)

        status, answer = inject("prose@example.net", "word@example.net", "utf8@example.net")
        assert status == 503  # every recipient refused, one of them for now
        assert [r["error"] for r in answer["recipients"]] == [f"550 5.7.26 {PROSE}", FAILED, FAILED]
        assert len(pigeon.wait_records("PolicyFailure", 4)) == 4
