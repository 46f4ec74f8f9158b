"""Golden transcripts: client bytes in, the exact replies out, one session per file.

Format of tests/unit/smtp/transcripts/*.txt (one directive per line; blank lines and
lines starting with "#" are ignored):

    @config KEY=VALUE ...     ServerConfig fields for this session (before the first step)
    @answer VERB CODE [X.Y.Z] TEXT
                              answer the next VERB decision (EHLO HELO MAIL RCPT DATA MESSAGE
                              STARTTLS AUTH) with this reply instead of accepting it
    C: text                   client bytes, CRLF appended
    B: text                   client bytes, nothing appended (for bare LF, partial lines)
    S: text                   one expected reply line (without CRLF)
    S: <nothing>              the step gets no reply at all
    E: summary                an event the step must produce (in order, see harness.summarize)

Consecutive C:/B: lines form one step and are fed in ONE receive_data call, so a group of
commands is pipelined. The S: lines after a step must equal, exactly and in order, everything
the session wrote in that step (data_to_send() is called once per step). S: lines before the
first C: line are the banner. In C:/B: text, \\r \\n \\t \\0 \\xHH and \\\\ are escapes and
{{x*1000}} repeats "x" 1000 times. A step that makes the session close must say so with an
"E: Closing ..." line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pigeon.smtp.events import Closing, MailFrom, Notify, RcptTo, Ret
from pigeon.smtp.framing import BareLinefeeds
from pigeon.smtp.replies import Reply

from .harness import HOSTNAME, Peer, config, open_transaction, summarize

TRANSCRIPTS = Path(__file__).parent / "transcripts"
NOTHING = "<nothing>"
_TOKEN = re.compile(r"\{\{(?P<text>.+?)\*(?P<count>\d+)\}\}|\\(?P<escape>x[0-9A-Fa-f]{2}|[rnt0\\])")
_ESCAPES = {"r": b"\r", "n": b"\n", "t": b"\t", "0": b"\0", "\\": b"\\"}
_REPLY = re.compile(r"(?P<code>[2-5][0-9][0-9]) (?:(?P<enhanced>[245]\.[0-9]{1,3}\.[0-9]{1,3}) )?(?P<text>.+)")


@dataclass
class Step:
    line: int
    data: bytes = b""
    replies: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    answers: list[tuple[str, Reply]] = field(default_factory=list)
    nothing: bool = False

    @property
    def closed(self) -> bool:
        return bool(self.replies or self.events or self.nothing)


@dataclass
class Transcript:
    config: dict[str, object]
    steps: list[Step]


def unescape(text: str) -> bytes:
    out = bytearray()
    pos = 0
    for match in _TOKEN.finditer(text):
        out += text[pos : match.start()].encode("utf-8")
        if match["escape"] is not None:
            escape = match["escape"]
            out += bytes([int(escape[1:], 16)]) if escape.startswith("x") else _ESCAPES[escape]
        else:
            out += unescape(match["text"]) * int(match["count"])
        pos = match.end()
    out += text[pos:].encode("utf-8")
    return bytes(out)


def _config_value(key: str, value: str) -> object:
    default = getattr(config(), key)  # AttributeError: unknown key, the transcript is wrong
    if isinstance(default, bool):
        assert value in ("true", "false"), f"{key} takes true or false"
        return value == "true"
    if isinstance(default, int):
        return int(value)
    if isinstance(default, BareLinefeeds):
        return BareLinefeeds[value]
    if isinstance(default, tuple):
        return tuple(value.split(",")) if value else ()
    raise AssertionError(f"cannot set {key} from a transcript")


def parse_transcript(text: str) -> Transcript:
    settings: dict[str, object] = {}
    steps: list[Step] = []
    answers: list[tuple[str, Reply]] = []
    current: Step | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("@config "):
            assert not steps and current is None, f"line {number}: @config must come first"
            for item in line.split()[1:]:
                key, _, value = item.partition("=")
                settings[key] = _config_value(key, value)
            continue
        if line.startswith("@answer "):
            _, verb, reply_text = line.split(" ", 2)
            match = _REPLY.fullmatch(reply_text)
            assert match, f"line {number}: bad reply {reply_text!r}"
            answers.append((verb, Reply(int(match["code"]), match["enhanced"], (match["text"],))))
            continue
        tag, sep, rest = line.partition(": ")
        if not sep and line in ("C:", "B:", "S:", "E:"):
            tag, rest = line[:1], ""
        assert tag in ("C", "B", "S", "E"), f"line {number}: unknown line {line!r}"
        if tag in ("C", "B"):
            if current is None or current.closed:
                current = Step(number, answers=answers)
                answers = []
                steps.append(current)
            current.data += unescape(rest) + (b"\r\n" if tag == "C" else b"")
            continue
        if current is None:  # the banner, before any client line
            current = Step(number)
            steps.append(current)
        if tag == "S":
            assert not current.events, f"line {number}: S: lines come before E: lines"
            if rest == NOTHING:
                current.nothing = True
            else:
                current.replies.append(rest)
        else:
            current.events.append(rest)
    assert not answers, "@answer lines after the last step"
    for step in steps:
        assert step.replies or step.nothing, f"line {step.line}: the step has no S: line (use 'S: {NOTHING}')"
        assert not (step.replies and step.nothing), f"line {step.line}: S: {NOTHING} and replies together"
    return Transcript(settings, steps)


def _is_subsequence(wanted: list[str], got: list[str]) -> bool:
    remaining = iter(got)
    return all(any(item == candidate for candidate in remaining) for item in wanted)


def run_transcript(transcript: Transcript) -> None:
    peer = Peer.start(config(**transcript.config))
    for step in transcript.steps:
        for verb, reply in step.answers:
            peer.answer(verb, reply)
        before = len(peer.events)
        output = peer.send(step.data)
        if step is transcript.steps[0]:
            output = peer.banner + output
        got = [summarize(event) for event in peer.events[before:]]
        expected = "".join(f"{reply}\r\n" for reply in step.replies)
        assert output == expected, f"line {step.line}: replies differ\n{_diff(expected, output)}"
        assert _is_subsequence(step.events, got), f"line {step.line}: events {step.events} not in order in {got}"
        if any(event.startswith("Closing") for event in got):
            assert any(e.startswith("Closing") for e in step.events), f"line {step.line}: unexpected {got}"
    assert not peer.unanswered_answers(), f"@answer never used: {peer.unanswered_answers()}"


def _diff(expected: str, output: str) -> str:
    want = expected.split("\r\n")
    have = output.split("\r\n")
    rows = [f"  {'=' if w == h else '!'} expected {w!r}\n    got      {h!r}" for w, h in zip(want, have, strict=False)]
    rows += [f"  + expected {w!r}" for w in want[len(have) :]] + [f"  + got      {h!r}" for h in have[len(want) :]]
    return "\n".join(rows)


@pytest.mark.parametrize("path", sorted(TRANSCRIPTS.glob("*.txt")), ids=lambda path: path.stem)
def test_transcript(path: Path) -> None:
    run_transcript(parse_transcript(path.read_text(encoding="utf-8")))


def test_there_are_golden_transcripts() -> None:
    assert len(list(TRANSCRIPTS.glob("*.txt"))) >= 20


# --- the harness itself must be able to fail ------------------------------------------------
def test_harness_rejects_a_transcript_with_a_wrong_reply() -> None:
    transcript = parse_transcript("S: 220 mx.test ESMTP Pigeon\nC: NOOP\nS: 250 Ok\n")
    with pytest.raises(AssertionError, match="replies differ"):
        run_transcript(transcript)  # the enhanced code left out


def test_harness_rejects_a_transcript_with_a_missing_reply() -> None:
    transcript = parse_transcript("S: 220 mx.test ESMTP Pigeon\nC: NOOP\\r\\nNOOP\nS: 250 2.0.0 Ok\n")
    with pytest.raises(AssertionError, match="replies differ"):
        run_transcript(transcript)


def test_harness_rejects_an_undeclared_close() -> None:
    transcript = parse_transcript("S: 220 mx.test ESMTP Pigeon\nC: QUIT\nS: 221 2.0.0 mx.test closing connection\n")
    with pytest.raises(AssertionError, match="unexpected"):
        run_transcript(transcript)


def test_harness_rejects_a_missing_event() -> None:
    transcript = parse_transcript("S: 220 mx.test ESMTP Pigeon\nC: NOOP\nS: 250 2.0.0 Ok\nE: TransactionReset\n")
    with pytest.raises(AssertionError, match="not in order"):
        run_transcript(transcript)


def test_harness_escapes_and_repeats() -> None:
    assert unescape(r"a\r\n\x00\\{{ab*3}}\0ü") == b"a\r\n\x00\\ababab\x00\xc3\xbc"


# --- DSN parameters on the events (the application reads these fields) ---------------------
def test_dsn_ret_and_envid_are_on_the_mail_from_event() -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    assert peer.send("MAIL FROM:<a@example.org> RET=HDRS ENVID=QQ+2B314159\r\n") == "250 2.1.0 Sender ok\r\n"
    [mail] = peer.of_type(MailFrom)
    assert mail == MailFrom("a@example.org", ret=Ret.HDRS, envid="QQ+314159")


def test_dsn_notify_and_orcpt_are_on_the_rcpt_to_event() -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    peer.send("MAIL FROM:<a@example.org> RET=FULL\r\n")
    reply = peer.send("RCPT TO:<b@example.net> NOTIFY=SUCCESS,DELAY ORCPT=rfc822;B+40example.net\r\n")
    assert reply == "250 2.1.5 Recipient ok\r\n"
    assert peer.send("RCPT TO:<c@example.net> NOTIFY=never\r\n") == "250 2.1.5 Recipient ok\r\n"
    first, second = peer.of_type(RcptTo)
    assert first == RcptTo("b@example.net", frozenset({Notify.SUCCESS, Notify.DELAY}), "rfc822;B@example.net")
    assert second == RcptTo("c@example.net", frozenset({Notify.NEVER}))
    assert peer.of_type(MailFrom) == [MailFrom("a@example.org", ret=Ret.FULL)]


def test_notify_never_with_success_is_refused_and_offers_no_decision() -> None:
    peer = Peer.start()
    open_transaction(peer)
    reply = peer.send("RCPT TO:<c@example.net> NOTIFY=NEVER,SUCCESS\r\n")
    assert reply == "501 5.5.4 NOTIFY=NEVER cannot be combined with other values\r\n"
    assert [event.recipient for event in peer.of_type(RcptTo)] == ["b@example.net"]


def test_dsn_parameters_are_refused_when_dsn_is_not_offered() -> None:
    peer = Peer.start(config(dsn=False))
    assert "DSN" not in peer.send("EHLO client.test\r\n")
    assert peer.send("MAIL FROM:<a@example.org> RET=HDRS\r\n") == "555 5.5.4 RET is not offered (DSN)\r\n"
    assert peer.of_type(MailFrom) == []


def test_quit_closes_with_the_221_reply() -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    assert peer.send("QUIT\r\nNOOP\r\n") == f"221 2.0.0 {HOSTNAME} closing connection\r\n"
    closing = peer.closing()
    assert isinstance(closing, Closing)
    assert closing.reply is not None
    assert closing.reply.code == 221
