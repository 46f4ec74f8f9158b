"""Every reply code at every step of the client: only a 2xx is success, only DATA has a 354.

Found from outside: a peer that answered DATA with `250 2.0.0 Ok: queued` (or the end of data
with `354 more?`) had its recipients logged as delivered, the content never sent. RFC 5321
4.2.1 and 4.3.2: a 2xx is a command done, 354 (to DATA alone) asks for the content. Any other
positive reply is no answer to that command, so it is a `ClientProtocolError` (the I/O layer
drops the connection and defers every recipient of the transaction), never a result.

`Scripted` plays a server that answers each command with the code a test gives it, so every
code from 200 to 599 can be put at every step, in every way a transaction runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pigeon.smtp.client import (
    Capabilities,
    ClientProtocolError,
    Envelope,
    Recipient,
    Result,
    Transaction,
    bdat_not_understood,
    rcpt_reply_read,
)
from pigeon.smtp.client_session import (
    ClientSession,
    Closed,
    Deliver,
    Phase,
    Ready,
    StartTls,
    TlsPolicy,
    TransactionDone,
    Unusable,
)
from pigeon.smtp.events import _NeedData
from pigeon.smtp.replies import Reply

BODY = b"Subject: codes\r\n\r\nhello\r\n"
PEER = Capabilities(frozenset({"PIPELINING", "CHUNKING"}))
MODES = {
    "pipelining+chunking": {},
    "pipelining+data": {"chunking": False},
    "lockstep+chunking": {"pipelining": False},
    "lockstep+data": {"pipelining": False, "chunking": False},
}
STEPS = ("RSET", "MAIL", "RCPT1", "RCPT2", "DATA", "END")  # END: the final dot, or BDAT ... LAST
CODES = range(200, 600)


def allowed(step: str, code: int) -> bool:
    """What RFC 5321 4.3.2 lets the step's command answer: an error, or its one kind of yes."""
    return code >= 400 or (code == 354 if step == "DATA" else code < 300)


def reply(step: str, code: int) -> Reply:
    return Reply(code, None, (step,))  # the step in the text: where a recipient's reply came from


@dataclass
class Scripted:
    """A sans-IO server that answers each command with `codes[step]` (250, and 354 to DATA,
    by default), whatever came before: it keeps no state a client could rely on."""

    codes: dict[str, int]
    read: list[Reply] = field(default_factory=list)  # every reply the client read, in order
    content: bytes | None = None  # the message, once its end arrived
    _buf: bytes = b""
    _rcpts: int = 0
    _in_data: bool = False

    def feed(self, data: bytes) -> list[Reply]:
        self._buf += data
        out: list[Reply] = []
        while self._buf:
            if self._in_data:
                if self._buf.startswith(b".\r\n"):
                    end, content = 3, b""
                elif (at := self._buf.find(b"\r\n.\r\n")) >= 0:
                    end, content = at + 5, self._buf[: at + 2]
                else:
                    break
                self._buf, self._in_data = self._buf[end:], False
                out.append(self._end(content))
                continue
            line, crlf, rest = self._buf.partition(b"\r\n")
            if not crlf:
                break
            verb = line.split(b" ", 1)[0].decode()
            if verb == "BDAT":
                size = int(line.split()[1])
                if len(rest) < size:
                    break
                self._buf = rest[size:]
                out.append(self._end(rest[:size]))
                continue
            self._buf = rest
            if verb == "RCPT":
                self._rcpts += 1
                verb = f"RCPT{self._rcpts}"
            elif verb == "DATA":
                self._in_data = self.codes.get("DATA", 354) == 354
            out.append(self._answer(verb, 354 if verb == "DATA" else 250))
        return out

    def _end(self, content: bytes) -> Reply:
        self.content = content
        return self._answer("END", 250)

    def _answer(self, step: str, default: int) -> Reply:
        return reply(step, self.codes.get(step, default))


def run(codes: dict[str, int], mode: str) -> tuple[Result | ClientProtocolError, Scripted]:
    """A two-recipient transaction against `Scripted(codes)`, one reply at a time, to its end or
    its protocol error."""
    server = Scripted(codes)
    envelope = Envelope("a@example.org", [Recipient("b@example.net"), Recipient("c@example.net")], BODY)
    transaction = Transaction(envelope, PEER, reset_first="RSET" in codes, **MODES[mode])
    waiting = server.feed(transaction.start())
    while not transaction.done:
        assert waiting, "the client waits for a reply the server will never send"
        server.read.append(waiting.pop(0))
        try:
            out = transaction.on_reply(server.read[-1])
        except ClientProtocolError as error:
            return error, server
        waiting += server.feed(out)
    assert not waiting or transaction.closing is not None, "replies left over"  # (a 421 ends it at once)
    return transaction.result(), server


@pytest.mark.parametrize(
    ("step", "mode"), [(step, mode) for step in STEPS for mode in MODES if step != "DATA" or mode.endswith("data")]
)
def test_every_code_at_every_step_is_a_success_a_refusal_or_a_protocol_error(step: str, mode: str) -> None:
    for code in CODES:
        outcome, server = run({step: code}, mode)
        at = reply(step, code)
        if not allowed(step, code):
            assert isinstance(outcome, ClientProtocolError), (code, outcome)
            assert server.read[-1] == at  # at once: nothing said after it was read
            assert str(at) in str(outcome)
            continue
        assert isinstance(outcome, Result), (code, outcome)
        if code == 421:  # RFC 5321 3.8: at any step, the end of the transaction and its reply
            assert outcome.replies == [at, at], step
            continue
        end = reply("END", 250)
        if step == "END" and mode.endswith("chunking") and code in (500, 502, 504):
            # BDAT not understood: no verdict on the message, which goes again with DATA.
            assert outcome.replies == [bdat_not_understood(at)] * 2
            assert outcome.bdat_not_understood == at
            continue
        expected = {
            "RSET": [end, end],  # refused or not, MAIL comes next, and its reply says
            "MAIL": [end, end] if code < 300 else [at, at],
            "RCPT1": [end, end] if code < 300 else [rcpt_reply_read(at), end],
            "RCPT2": [end, end] if code < 300 else [end, rcpt_reply_read(at)],
            "DATA": [end, end] if code == 354 else [at, at],
            "END": [at, at],
        }[step]
        assert outcome.replies == expected, code
        if any(r.is_success for r in outcome.replies):
            assert server.content == BODY, code


def run_session(
    codes: dict[str, int], mode: str, *, drop: str | None = None
) -> tuple[list[object], ClientSession, Scripted]:
    """The transaction of `run`, through a `ClientSession`: the server (`Scripted(codes)`)
    closes the connection after each 421, and at `drop` without answering that step (nor
    any after it). Returns the session's events, the session, and the server."""
    server = Scripted(codes)
    mode_options = MODES[mode]
    pipelining, chunking = mode_options.get("pipelining", True), mode_options.get("chunking", True)
    session = ClientSession("client.test", tls=TlsPolicy.DISABLED, pipelining=pipelining, chunking=chunking)
    session.receive_data(BANNER)
    events(session)
    session.data_to_send()
    session.receive_data(b"250-mx.test\r\n250-PIPELINING\r\n250 CHUNKING\r\n")
    assert isinstance(events(session)[-1], Ready)
    session.data_to_send()
    envelope = Envelope("a@example.org", [Recipient("b@example.net"), Recipient("c@example.net")], BODY)
    seen: list[object] = []
    waiting = server.feed(session.send(Deliver(envelope)))
    while waiting:
        answer = waiting.pop(0)
        server.read.append(answer)
        if answer.text == drop:
            session.receive_data(b"")  # hung up without answering it
            return seen + events(session), session, server
        session.receive_data(str(answer).encode() + b"\r\n")
        if answer.code == 421:
            session.receive_data(b"")  # RFC 5321 3.8: and closes
        seen += events(session)
        if session.phase is Phase.CLOSED:
            break
        waiting += server.feed(session.data_to_send())
    return seen, session, server


# Where a 421 comes, in a two-recipient transaction: "RCPT2" after RCPT1's 250.
AT_421 = ("MAIL", "RCPT1", "RCPT2", "DATA", "END")
# How the session names the command of each step (`ClientSession.unanswered`, `Result.closing_answered`).
ANSWERED = {
    "RSET": "RSET",
    "MAIL": "MAIL FROM",
    "RCPT1": "RCPT TO",
    "RCPT2": "RCPT TO",
    "DATA": "DATA",
    "END": "the end of data",
}


@pytest.mark.parametrize(
    ("step", "mode"), [(step, mode) for step in AT_421 for mode in MODES if step != "DATA" or mode.endswith("data")]
)
def test_a_421_before_the_reply_to_the_end_of_data_says_nothing_of_a_message_delivered_twice(
    step: str, mode: str
) -> None:
    # Replies come in order (RFC 2920 3.1): a 421 in place of any of them, even with BDAT LAST
    # gone out with MAIL (PIPELINING with CHUNKING), is the server going away before it
    # answered the end of data. It took no message: a definite no, in the server's words,
    # which sends its recipients to the next MX at once rather than to a "may be delivered
    # twice" and the retry schedule.
    seen, session, _ = run_session({step: 421}, mode)
    at = reply(step, 421)
    (done,) = [event for event in seen if isinstance(event, TransactionDone)]
    assert done.result.replies == [at, at], (step, mode)
    # And nothing else: no mark that the end went unanswered, for the I/O layer to turn into
    # a "may be delivered twice" (a Result compares as a whole, every field), but the 421 and
    # the command it answered, which the I/O layer quotes after it.
    mail, data, reset = done.result.mail_reply, done.result.data_reply, done.result.needs_reset
    answered = ANSWERED[step]
    expected = Result([at, at], mail, data, needs_reset=reset, closing=at, closing_answered=answered)
    assert done.result == expected, (step, mode)
    assert seen[-1] == Closed(at)
    assert not session.end_of_data_unanswered(), (step, mode)


# Where the server hangs up without a word, the codes of the replies before, and whether the
# end of the content had gone out to a server that may have taken it.
DROPS = [
    ("END", {}, True),  # every recipient accepted: the true case
    ("END", {"RCPT2": 550}, True),  # one is enough
    ("END", {"RCPT1": 550, "RCPT2": 550}, False),  # nobody to deliver to (with DATA: the empty data)
    ("RCPT1", {"MAIL": 550}, False),  # MAIL refused: nobody at all
    ("RCPT1", {}, True),  # with BDAT LAST out, the RCPT replies unknown: they may have been 250
    ("DATA", {}, False),  # the content never went
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("drop", "codes", "doubt"), DROPS)
def test_a_hang_up_says_the_message_may_be_delivered_twice_only_if_the_server_may_have_taken_it(
    mode: str, drop: str, codes: dict[str, int], doubt: bool
) -> None:
    seen, session, server = run_session(codes, mode, drop=drop)
    if drop not in [answer.text for answer in server.read]:
        # This mode never got there: lock-step, every recipient refused (no DATA, no BDAT), or
        # DATA asked of a BDAT session.
        assert not session.end_of_data_unanswered(), (drop, codes, mode)
        return
    assert not any(isinstance(event, TransactionDone) for event in seen)
    assert seen[-1] == Closed(None)
    content_out = server.content is not None
    assert session.end_of_data_unanswered() == (doubt and content_out), (drop, codes, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("drop", ["MAIL", "RCPT1", "RCPT2", "DATA", "END"])
def test_a_hang_up_names_the_first_command_left_unanswered(mode: str, drop: str) -> None:
    """What the I/O layer says of the break ("closed the connection after RCPT TO"): with
    PIPELINING every command went at once, and the first without its reply is where the
    server stopped (RFC 2920 3.1: replies come in order)."""
    seen, session, server = run_session({}, mode, drop=drop)
    if drop not in [answer.text for answer in server.read]:
        return  # (DATA in a BDAT session)
    assert seen[-1] == Closed(None)
    assert session.unanswered() == ANSWERED[drop], (mode, drop)


def test_a_session_names_what_it_awaits_and_nothing_when_idle() -> None:
    session = ClientSession("client.test", tls=TlsPolicy.DISABLED)
    assert session.unanswered() is None  # the greeting: no command of ours
    session.receive_data(BANNER)
    events(session)
    assert session.data_to_send() == b"EHLO client.test\r\n"
    assert session.unanswered() == "EHLO"
    session.receive_data(b"250-mx.test\r\n250 PIPELINING\r\n")
    assert isinstance(events(session)[-1], Ready)
    assert session.unanswered() is None
    envelope = Envelope("a@example.org", [Recipient("b@example.net")], BODY)
    session.send(Deliver(envelope))
    assert session.unanswered() == "MAIL FROM"
    session.receive_data(b"250 ok\r\n")
    assert events(session) == []
    assert session.unanswered() == "RCPT TO"  # (DATA went too, its reply not awaited first)


@pytest.mark.parametrize("mode", MODES)
@given(codes=st.fixed_dictionaries({}, optional={step: st.sampled_from(CODES) for step in STEPS}))
def test_whatever_the_codes_a_recipient_succeeds_only_on_a_2xx_to_its_whole_content(
    mode: str, codes: dict[str, int]
) -> None:
    outcome, server = run(codes, mode)
    if isinstance(outcome, ClientProtocolError):
        # Raised at the first reply its command cannot have, and only then.
        *before, last = server.read
        assert not allowed(last.text, last.code)
        assert all(allowed(r.text, r.code) for r in before)
        return
    assert all(allowed(r.text, r.code) for r in server.read)
    for result in outcome.replies:
        assert not 300 <= result.code < 400  # never a "354" delivery
        if result.is_success:
            assert result == reply("END", result.code)  # the server's answer to the end of data
            assert server.content == BODY


# --- the session: the opening's commands, and a broken transaction ---------------------------------
BANNER = b"220 mx.test ESMTP\r\n"


def session_after(tls: TlsPolicy, *replies: bytes) -> ClientSession:
    """A session that read the banner and each of `replies` in turn (its events and writes
    taken after each but the last, which it has yet to read)."""
    session = ClientSession("client.test", tls=tls)
    for data in (BANNER, *replies[:-1]):
        session.receive_data(data)
        events(session)
        session.data_to_send()
    session.receive_data(replies[-1])
    return session


def events(session: ClientSession) -> list[object]:
    seen: list[object] = []
    while not isinstance(event := session.next_event(), _NeedData):
        seen.append(event)
        if isinstance(event, (Closed, Unusable)):
            break
    return seen


@pytest.mark.parametrize("command", ["EHLO", "HELO", "STARTTLS"])
def test_every_code_to_an_opening_command_is_its_yes_a_no_or_a_protocol_error(command: str) -> None:
    """RFC 5321 4.3.2, RFC 3207 4: 250 to EHLO and HELO, 220 to STARTTLS. A 220 to EHLO or a
    250 to STARTTLS is no refusal to fall back from (to HELO, to the clear)."""
    before = {"EHLO": [], "HELO": [b"502 5.5.1 no EHLO\r\n"], "STARTTLS": [b"250-mx.test\r\n250 STARTTLS\r\n"]}
    yes = {"EHLO": 250, "HELO": 250, "STARTTLS": 220}[command]
    for code in CODES:
        session = session_after(TlsPolicy.OPPORTUNISTIC, *before[command], b"%d x\r\n" % code)
        if code < 400 and code != yes:
            with pytest.raises(ClientProtocolError, match=f"answered {command} with {code} x"):
                events(session)
            assert session.phase is Phase.CLOSED
            assert session.data_to_send() == b""  # no HELO, no QUIT: nothing more on the connection
            assert session.next_event() == Closed(None)
            continue
        seen = events(session)
        if code == yes:
            assert isinstance(seen[-1], StartTls if command == "STARTTLS" else Ready), code
        elif code == 421 or command == "HELO":
            assert isinstance(seen[-1], Unusable), code
        elif command == "EHLO":
            assert seen == [] and session.data_to_send().endswith(b"HELO client.test\r\n"), code
        else:
            assert seen == [Ready(Capabilities(frozenset({"STARTTLS"})), tls=False)], code  # refused: the clear


@pytest.mark.parametrize(
    "replies",
    [
        b"250 ok\r\n250 ok\r\n250 2.0.0 Ok: queued\r\n",  # DATA answered as if it were the end of data
        b"250 ok\r\n250 ok\r\n354 go\r\n354 more?\r\n",  # the end of data answered as if it were DATA
        b"250 ok\r\n250 ok\r\n220 hmm\r\n",
        b"354 go\r\n",  # MAIL
        b"250 ok\r\n354 go\r\n",  # RCPT
    ],
)
def test_a_reply_its_command_cannot_have_ends_the_session_with_no_result(replies: bytes) -> None:
    session = session_after(TlsPolicy.DISABLED, b"250-mx.test\r\n250 PIPELINING\r\n")
    assert isinstance(events(session)[-1], Ready)
    session.data_to_send()
    session.send(Deliver(Envelope("a@example.org", [Recipient("b@example.net")], BODY)))
    session.receive_data(replies)
    with pytest.raises(ClientProtocolError):
        events(session)
    assert session.phase is Phase.CLOSED
    assert session.next_event() == Closed(None)  # no TransactionDone, ever
    assert session.data_to_send() == b""  # nothing more said: not QUIT as content, nor the content
    # Broken at the reply to the end of data (the content went out): the message may be taken.
    assert session.end_of_data_unanswered() == replies.endswith(b"354 more?\r\n")
