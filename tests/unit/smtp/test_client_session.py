"""The client session alone, driven by scripted server replies: every phase, every policy.

`Script` plays the server by hand: it feeds reply lines to a `ClientSession`, collects the
events, and records each write the session asks for. Tests assert on what a peer would see
(the bytes written) and on what the I/O layer is told (the events).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.smtp.client import Capabilities, ClientProtocolError, Envelope, Recipient
from pigeon.smtp.client_session import (
    _EXPECTS,
    _NEXT,
    ClientSession,
    Closed,
    Deliver,
    Event,
    Phase,
    PlaintextAfterStartTls,
    Quit,
    Ready,
    Reason,
    StartTls,
    Step,
    TlsPolicy,
    TransactionDone,
    Unusable,
)
from pigeon.smtp.errors import SmtpUsageError
from pigeon.smtp.events import _NeedData
from pigeon.smtp.replies import Reply

BANNER = b"220 mx.test ESMTP\r\n"
EHLO_PLAIN = b"250-mx.test greets client.test\r\n250-PIPELINING\r\n250-SIZE 1000\r\n250 CHUNKING\r\n"
EHLO_TLS = b"250-mx.test greets client.test\r\n250-PIPELINING\r\n250-STARTTLS\r\n250 SIZE 1000\r\n"
EHLO_AFTER_TLS = b"250-mx.test greets client.test\r\n250-PIPELINING\r\n250-AUTH PLAIN\r\n250 SIZE 2000\r\n"
BODY = b"Subject: x\r\n\r\nhi\r\n"


def envelope(*recipients: str) -> Envelope:
    return Envelope("a@example.org", [Recipient(r) for r in recipients or ("b@example.net",)], BODY)


@dataclass
class Script:
    """A ClientSession and everything it wrote and said."""

    session: ClientSession
    writes: list[bytes] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    @classmethod
    def start(
        cls, tls: TlsPolicy = TlsPolicy.OPPORTUNISTIC, *, pipelining: bool = True, chunking: bool = True
    ) -> Script:
        return cls(ClientSession("client.test", tls=tls, pipelining=pipelining, chunking=chunking))

    def server(self, data: bytes) -> list[Event]:
        """The server sends `data` (b"" closes); returns the new events, records the writes."""
        self.session.receive_data(data)
        return self.pump()

    def pump(self) -> list[Event]:
        new: list[Event] = []
        while True:
            event = self.session.next_event()
            if isinstance(event, _NeedData):
                break
            if isinstance(event, (Closed, Unusable)):
                if not any(seen is event for seen in self.events):  # once closed, it says so again
                    new.append(event)
                break
            new.append(event)
        self.events += new
        out = self.session.data_to_send()
        if out:
            self.writes.append(out)
        return new

    def send(self, command: Deliver | Quit) -> bytes:
        out = self.session.send(command)
        self.writes.append(out)
        return out

    def last_write(self) -> bytes:
        return self.writes[-1] if self.writes else b""


def greeted(tls: TlsPolicy = TlsPolicy.DISABLED, ehlo: bytes = EHLO_PLAIN, **options: bool) -> Script:
    script = Script.start(tls, **options)
    script.server(BANNER)
    (ready,) = script.server(ehlo)
    assert isinstance(ready, Ready)
    return script


# --- the table --------------------------------------------------------------------------------
def test_every_phase_that_waits_for_a_reply_knows_where_accepted_and_refused_lead() -> None:
    for phase in _EXPECTS:
        assert set(_NEXT[phase]) >= {Step.ACCEPTED, Step.REFUSED}, phase


def test_every_phase_but_closed_can_be_left_and_closed_can_be_reached_from_the_banner() -> None:
    assert set(_NEXT) == set(Phase) - {Phase.CLOSED}
    reachable, todo = {Phase.BANNER}, [Phase.BANNER]
    while todo:
        for target in _NEXT.get(todo.pop(), {}).values():
            if target not in reachable:
                reachable.add(target)
                todo.append(target)
    assert reachable == set(Phase)


# --- banner and greeting ----------------------------------------------------------------------
def test_nothing_is_written_before_the_banner() -> None:
    script = Script.start()
    assert script.pump() == []
    assert script.writes == []
    assert script.session.phase is Phase.BANNER


def test_a_220_banner_is_answered_with_ehlo() -> None:
    script = Script.start()
    assert script.server(BANNER) == []
    assert script.writes == [b"EHLO client.test\r\n"]
    assert script.session.phase is Phase.EHLO


@pytest.mark.parametrize("banner", [b"554 5.3.2 go away\r\n", b"421 4.3.2 busy\r\n", b"250 odd\r\n"])
def test_any_other_banner_makes_the_server_unusable_and_the_client_says_quit(banner: bytes) -> None:
    script = Script.start()
    (event,) = script.server(banner)
    assert isinstance(event, Unusable)
    assert event.reason is Reason.BANNER
    assert event.reply is not None and event.reply.code == int(banner[:3])
    assert script.writes == [b"QUIT\r\n"]


@pytest.mark.parametrize("banner", [b"554 5.3.2 go away\r\n", b"250 odd\r\n"])
def test_a_banner_other_than_a_4xx_is_recorded_as_451_4_4_1_quoting_it(banner: bytes) -> None:
    (event,) = Script.start().server(banner)
    assert isinstance(event, Unusable)
    explained = event.explain("mx.test [192.0.2.1]:25")
    assert (explained.code, explained.enhanced) == (451, "4.4.1")
    assert explained.text.startswith("mx.test [192.0.2.1]:25 greeted with: " + banner[:3].decode())


@pytest.mark.parametrize("banner", [b"421 4.7.0 rate limited\r\n", b"450-4.7.0 busy,\r\n450 4.7.0 rate limited\r\n"])
def test_a_4xx_banner_is_the_attempts_reply_in_the_servers_own_words(banner: bytes) -> None:
    # Found from outside: a 421 greeting was logged as "451 4.4.1 ... greeted with: 421 ...",
    # so no `^421 4\.7\.0` reaction could match it.
    script = Script.start()
    (event,) = script.server(banner)
    assert isinstance(event, Unusable) and event.reason is Reason.BANNER
    explained = event.explain("mx.test [192.0.2.1]:25")
    assert (explained.code, explained.enhanced) == (int(banner[:3]), "4.7.0")
    assert str(explained).startswith(f"{banner[:3].decode()} 4.7.0 ")
    assert str(explained).endswith("rate limited (greeting of mx.test [192.0.2.1]:25)")


def test_ehlo_accepted_gives_ready_with_the_capabilities_offered() -> None:
    script = Script.start(TlsPolicy.DISABLED)
    script.server(BANNER)
    (ready,) = script.server(EHLO_PLAIN)
    assert ready == Ready(Capabilities(frozenset({"PIPELINING", "SIZE", "CHUNKING"}), size=1000), tls=False)
    assert script.session.capabilities == ready.capabilities
    assert script.session.is_ready()
    assert script.writes == [b"EHLO client.test\r\n"]  # nothing more: no extra round trip


@pytest.mark.parametrize(
    "refusal", [b"500 5.5.1 what?\r\n", b"502 5.5.2 no EHLO here\r\n", b"550 5.7.1 no\r\n", b"451 4.3.0 later\r\n"]
)
def test_ehlo_refused_falls_back_to_helo(refusal: bytes) -> None:
    script = Script.start()
    script.server(BANNER)
    assert script.server(refusal) == []
    assert script.writes == [b"EHLO client.test\r\n", b"HELO client.test\r\n"]
    (ready,) = script.server(b"250 mx.test\r\n")
    assert ready == Ready(Capabilities.helo_only(), tls=False)
    assert not ready.capabilities.esmtp


GMAIL_421 = (
    b"421-4.7.0 Try again later, closing connection. (EHLO)\r\n"
    b"421-4.7.0  For more information, go to\r\n"
    b"421 4.7.0  https://support.google.com/a/answer/3221692 a1-20020a.8 - gsmtp\r\n"
)


def test_a_421_to_ehlo_ends_the_session_without_helo_and_is_the_attempts_reply() -> None:
    # Found from outside: the 421 was taken for a refused EHLO, HELO followed into a closed
    # connection, and the attempt read "451 4.4.2 ... closed the connection".
    script = Script.start()
    script.server(BANNER)
    (event,) = script.server(GMAIL_421)
    assert isinstance(event, Unusable)
    assert (event.reason, event.detail) == (Reason.CLOSING, "EHLO")
    assert script.writes == [b"EHLO client.test\r\n", b"QUIT\r\n"]  # no HELO
    assert script.session.phase is Phase.CLOSED
    explained = event.explain("mx.test [192.0.2.1]:25")
    assert (explained.code, explained.enhanced) == (421, "4.7.0")
    assert str(explained).startswith("421 4.7.0 Try again later, closing connection. (EHLO) ")
    assert str(explained).endswith(" - gsmtp (answer of mx.test [192.0.2.1]:25 to EHLO)")


def test_a_421_to_the_ehlo_after_starttls_ends_the_session_too() -> None:
    script = starttls_script(TlsPolicy.OPPORTUNISTIC)
    script.server(EHLO_TLS + b"220 go ahead\r\n")
    script.session.tls_established()
    script.pump()
    assert script.last_write() == b"EHLO client.test\r\n"
    (event,) = script.server(b"421 4.7.0 rate limited, closing connection\r\n")
    assert event == Unusable(Reason.CLOSING, Reply(421, "4.7.0", ("rate limited, closing connection",)), "EHLO")
    assert script.last_write() == b"QUIT\r\n"
    assert script.writes.count(b"EHLO client.test\r\n") == 2 and b"HELO client.test\r\n" not in script.writes
    assert str(event.explain("mx [192.0.2.1]:25")).startswith("421 4.7.0 rate limited, closing connection (")


@pytest.mark.parametrize("policy", [TlsPolicy.OPPORTUNISTIC, TlsPolicy.REQUIRED])
def test_a_421_to_starttls_ends_the_session_rather_than_going_on_in_the_clear(policy: TlsPolicy) -> None:
    script = starttls_script(policy)
    script.server(EHLO_TLS)
    (event,) = script.server(b"421 4.3.2 shutting down\r\n")
    assert event == Unusable(Reason.CLOSING, Reply(421, "4.3.2", ("shutting down",)), "STARTTLS")
    explained = str(event.explain("mx [192.0.2.1]:25"))
    assert explained == "421 4.3.2 shutting down (answer of mx [192.0.2.1]:25 to STARTTLS)"


def test_a_421_to_helo_ends_the_session_in_the_servers_words() -> None:
    script = Script.start()
    script.server(BANNER + b"502 no\r\n")
    (event,) = script.server(b"421 4.7.0 busy\r\n")
    assert event == Unusable(Reason.CLOSING, Reply(421, "4.7.0", ("busy",)), "HELO")
    assert str(event.explain("mx [192.0.2.1]:25")) == "421 4.7.0 busy (answer of mx [192.0.2.1]:25 to HELO)"


def test_a_4xx_to_helo_after_ehlo_refused_is_the_attempts_reply_in_the_servers_words() -> None:
    script = Script.start()
    script.server(BANNER + b"502 no\r\n")
    (event,) = script.server(b"450 4.7.1 later\r\n")
    assert event == Unusable(Reason.GREETING, Reply(450, "4.7.1", ("later",)))
    explained = str(event.explain("mx [192.0.2.1]:25"))
    assert explained == "450 4.7.1 later (answer of mx [192.0.2.1]:25 to HELO, EHLO refused)"


def test_helo_refused_too_makes_the_server_unusable() -> None:
    script = Script.start()
    script.server(BANNER + b"502 no\r\n")
    (event,) = script.server(b"550 5.7.1 not you\r\n")
    assert event == Unusable(Reason.GREETING, Reply(550, "5.7.1", ("not you",)))
    assert event.explain("mx [192.0.2.1]:25") == Reply(
        451, "4.4.1", ("mx [192.0.2.1]:25 refused EHLO and HELO: 550 5.7.1 not you",)
    )
    assert script.last_write() == b"QUIT\r\n"


def test_a_transaction_after_helo_sends_no_esmtp_parameters() -> None:
    script = Script.start()
    script.server(BANNER + b"502 no\r\n")
    script.server(b"250 mx.test\r\n")
    out = script.send(Deliver(envelope()))
    assert out == b"MAIL FROM:<a@example.org>\r\n"  # no SIZE, no PIPELINING: lock-step


# --- STARTTLS under each policy -----------------------------------------------------------------
def starttls_script(policy: TlsPolicy) -> Script:
    script = Script.start(policy)
    script.server(BANNER)
    return script


@pytest.mark.parametrize("policy", [TlsPolicy.OPPORTUNISTIC, TlsPolicy.REQUIRED])
def test_starttls_offered_is_used_and_ehlo_said_again_on_tls(policy: TlsPolicy) -> None:
    script = starttls_script(policy)
    assert script.server(EHLO_TLS) == []
    assert script.last_write() == b"STARTTLS\r\n"
    assert script.server(b"220 2.0.0 go ahead\r\n") == [StartTls()]
    assert script.session.phase is Phase.HANDSHAKE
    writes = len(script.writes)
    script.session.tls_established()
    assert script.session.capabilities == Capabilities()  # RFC 3207 4.2: forgotten
    assert script.pump() == []
    assert script.writes[writes:] == [b"EHLO client.test\r\n"]
    (ready,) = script.server(EHLO_AFTER_TLS)
    assert ready == Ready(Capabilities(frozenset({"PIPELINING", "AUTH", "SIZE"}), 2000, ("PLAIN",)), tls=True)
    assert script.session.tls_active


def test_disabled_never_says_starttls_even_when_offered() -> None:
    script = starttls_script(TlsPolicy.DISABLED)
    (ready,) = script.server(EHLO_TLS)
    assert isinstance(ready, Ready)
    assert not ready.tls
    assert "STARTTLS" in ready.capabilities
    assert b"STARTTLS\r\n" not in script.writes


def test_opportunistic_goes_on_in_the_clear_when_starttls_is_not_offered() -> None:
    script = starttls_script(TlsPolicy.OPPORTUNISTIC)
    (ready,) = script.server(EHLO_PLAIN)
    assert isinstance(ready, Ready) and not ready.tls


def test_required_without_starttls_offered_is_unusable() -> None:
    script = starttls_script(TlsPolicy.REQUIRED)
    (event,) = script.server(EHLO_PLAIN)
    assert event == Unusable(Reason.TLS_NOT_OFFERED)
    assert event.explain("mx [192.0.2.1]:25") == Reply(
        451, "4.7.4", ("TLS required, but mx [192.0.2.1]:25 does not offer STARTTLS",)
    )
    assert script.writes == [b"EHLO client.test\r\n", b"QUIT\r\n"]


def test_required_with_a_helo_only_server_is_unusable() -> None:
    script = starttls_script(TlsPolicy.REQUIRED)
    script.server(b"500 no\r\n")
    (event,) = script.server(b"250 mx.test\r\n")
    assert event == Unusable(Reason.TLS_NOT_OFFERED)


def test_opportunistic_goes_on_in_the_clear_when_starttls_is_refused() -> None:
    script = starttls_script(TlsPolicy.OPPORTUNISTIC)
    script.server(EHLO_TLS)
    (ready,) = script.server(b"454 4.7.0 TLS not available\r\n")
    assert isinstance(ready, Ready) and not ready.tls
    assert "STARTTLS" in ready.capabilities  # the plaintext EHLO's offer stands: no EHLO again
    assert script.writes == [b"EHLO client.test\r\n", b"STARTTLS\r\n"]


def test_required_with_starttls_refused_is_unusable() -> None:
    script = starttls_script(TlsPolicy.REQUIRED)
    script.server(EHLO_TLS)
    (event,) = script.server(b"454 4.7.0 TLS not available\r\n")
    assert event == Unusable(Reason.TLS_REFUSED, Reply(454, "4.7.0", ("TLS not available",)))
    assert event.explain("mx [192.0.2.1]:25").text == (
        "TLS required, mx [192.0.2.1]:25 refused STARTTLS: 454 4.7.0 TLS not available"
    )
    assert script.last_write() == b"QUIT\r\n"


@pytest.mark.parametrize(
    ("policy", "retry"),
    [(TlsPolicy.OPPORTUNISTIC, True), (TlsPolicy.REQUIRED, False)],
    ids=["opportunistic", "required"],
)
def test_a_failed_handshake_is_unusable_and_only_opportunistic_may_retry_in_the_clear(
    policy: TlsPolicy, retry: bool
) -> None:
    script = starttls_script(policy)
    script.server(EHLO_TLS + b"220 go ahead\r\n")
    writes = list(script.writes)
    script.session.tls_failed("certificate verify failed")
    (event,) = script.pump()
    assert event == Unusable(Reason.TLS_FAILED, detail="certificate verify failed", retry_in_clear=retry)
    assert event.explain("mx [192.0.2.1]:25") == Reply(
        451, "4.7.5", ("TLS handshake with mx [192.0.2.1]:25 failed: certificate verify failed",)
    )
    assert script.writes == writes  # no QUIT in the clear on a connection that was half in TLS


def test_starttls_offered_again_after_tls_is_not_said_twice() -> None:
    script = starttls_script(TlsPolicy.REQUIRED)
    script.server(EHLO_TLS + b"220 go ahead\r\n")
    script.session.tls_established()
    script.pump()
    (ready,) = script.server(EHLO_TLS)  # a confused server still offers STARTTLS on TLS
    assert isinstance(ready, Ready) and ready.tls
    assert script.writes.count(b"STARTTLS\r\n") == 1


def test_helo_fallback_after_tls_too() -> None:
    script = starttls_script(TlsPolicy.REQUIRED)
    script.server(EHLO_TLS + b"220 go ahead\r\n")
    script.session.tls_established()
    script.pump()
    script.server(b"502 no EHLO on TLS\r\n")
    assert script.last_write() == b"HELO client.test\r\n"
    (ready,) = script.server(b"250 mx.test\r\n")
    assert ready == Ready(Capabilities.helo_only(), tls=True)


def test_plaintext_after_the_220_to_starttls_is_an_injection() -> None:
    script = starttls_script(TlsPolicy.OPPORTUNISTIC)
    script.server(EHLO_TLS)
    # (its own kind of broken protocol: a policy that requires TLS counts it as the host's TLS failure)
    with pytest.raises(PlaintextAfterStartTls, match="STARTTLS"):
        script.server(b"220 go ahead\r\n250-evil.test\r\n250 AUTH PLAIN\r\n")
    assert script.session.phase is Phase.CLOSED
    assert script.session.data_to_send() == b""


def test_a_partial_line_after_the_220_to_starttls_is_an_injection_too() -> None:
    script = starttls_script(TlsPolicy.OPPORTUNISTIC)
    script.server(EHLO_TLS)
    with pytest.raises(PlaintextAfterStartTls):
        script.server(b"220 go ahead\r\n2")


def test_plaintext_during_the_handshake_is_an_injection() -> None:
    script = starttls_script(TlsPolicy.OPPORTUNISTIC)
    script.server(EHLO_TLS + b"220 go ahead\r\n")
    with pytest.raises(PlaintextAfterStartTls, match="after the 220 reply to STARTTLS"):
        script.server(b"250 2.0.0 ok\r\n")
    with pytest.raises(SmtpUsageError):
        script.session.tls_established()


# --- transactions, RSET, QUIT --------------------------------------------------------------------
def test_a_pipelined_chunked_transaction_is_one_write_and_one_event() -> None:
    script = greeted()
    out = script.send(Deliver(envelope("b@example.net", "c@example.net")))
    assert out == (
        b"MAIL FROM:<a@example.org> SIZE=18\r\nRCPT TO:<b@example.net>\r\nRCPT TO:<c@example.net>\r\n"
        b"BDAT 18 LAST\r\n" + BODY
    )
    assert script.server(b"250 ok\r\n250 ok\r\n") == []
    assert script.session.phase is Phase.MAIL
    (done,) = script.server(b"250 ok\r\n250 2.0.0 queued\r\n")
    assert isinstance(done, TransactionDone)
    assert done.result.replies == [Reply(250, "2.0.0", ("queued",))] * 2
    assert len(script.writes) == 2  # EHLO, then the one write of the transaction
    assert script.session.is_ready()
    assert script.session.transactions == 1


def test_a_lockstep_transaction_writes_each_command_after_its_reply() -> None:
    script = greeted(ehlo=b"250 mx.test\r\n")
    assert script.send(Deliver(envelope())) == b"MAIL FROM:<a@example.org>\r\n"
    script.server(b"250 ok\r\n")
    assert script.last_write() == b"RCPT TO:<b@example.net>\r\n"
    script.server(b"250 ok\r\n")
    assert script.last_write() == b"DATA\r\n"
    script.server(b"354 go\r\n")
    assert script.last_write() == BODY + b".\r\n"
    (done,) = script.server(b"250 queued\r\n")
    assert isinstance(done, TransactionDone)


def test_an_unfinished_transaction_makes_the_next_one_start_with_rset_in_the_same_write() -> None:
    script = greeted()
    script.send(Deliver(envelope()))
    (done,) = script.server(b"250 ok\r\n550 5.1.1 unknown\r\n554 5.5.1 no valid recipients\r\n")
    assert isinstance(done, TransactionDone) and done.result.needs_reset
    assert script.session.needs_reset
    out = script.send(Deliver(envelope()))
    assert out.startswith(b"RSET\r\nMAIL FROM:<a@example.org> SIZE=18\r\n")
    (done,) = script.server(b"250 reset\r\n250 ok\r\n250 ok\r\n250 queued\r\n")
    assert isinstance(done, TransactionDone)
    assert not done.result.needs_reset and not script.session.needs_reset
    assert not script.send(Deliver(envelope())).startswith(b"RSET")


def test_quit_is_answered_and_closes() -> None:
    script = greeted()
    assert script.send(Quit()) == b"QUIT\r\n"
    (closed,) = script.server(b"221 2.0.0 bye\r\n")
    assert closed == Closed(Reply(221, "2.0.0", ("bye",)))
    assert script.session.phase is Phase.CLOSED
    assert script.session.next_event() == closed  # it keeps saying so


def test_quit_answered_by_a_close_closes_too() -> None:
    script = greeted()
    script.send(Quit())
    assert script.server(b"") == [Closed(None)]


def test_a_421_while_idle_closes_the_session() -> None:
    script = greeted()
    (closed,) = script.server(b"421 4.4.2 mx.test timeout, closing\r\n")
    assert closed == Closed(Reply(421, "4.4.2", ("mx.test timeout, closing",)))
    assert not script.session.is_ready()
    with pytest.raises(SmtpUsageError):
        script.session.send(Deliver(envelope()))


def test_a_421_within_a_pipelined_transaction_is_the_reply_of_every_recipient_without_one() -> None:
    # Found from outside: the 421 to RCPT was lost and the outcome read "closed the connection",
    # so no reaction saw it (without PIPELINING the reply was kept).
    script = greeted()
    script.send(Deliver(envelope("b@example.net", "c@example.net")))
    closing = Reply(421, "4.7.0", ("rate limited, closing",))
    done, closed = script.server(b"250 ok\r\n421 4.7.0 rate limited, closing\r\n")
    assert isinstance(done, TransactionDone) and done.result.replies == [closing, closing]
    assert closed == Closed(closing)
    assert script.server(b"") == []  # the server's close changes nothing


def test_a_close_within_a_transaction_without_a_421_says_nothing_more() -> None:
    script = greeted()
    script.send(Deliver(envelope("b@example.net")))
    assert script.server(b"250 ok\r\n550 5.1.1 unknown\r\n") == []
    assert script.server(b"") == [Closed(None)]


@pytest.mark.parametrize("pipelining", [True, False])
def test_a_refusal_before_the_server_closed_mid_transaction_stays_that_recipients_outcome(pipelining: bool) -> None:
    """Found from outside: a recipient refused 550 at RCPT was deferred with the others when the
    connection then closed, until it expired. Its refusal is its outcome; the accepted and the
    unanswered have none (the I/O layer gives them the break's reply)."""
    ehlo = EHLO_PLAIN if pipelining else b"250 mx.test\r\n"
    script = greeted(ehlo=ehlo, chunking=False)
    script.send(Deliver(envelope("taken@example.net", "unknown@example.net", "cut@example.net")))
    assert script.session.settled() == [None, None, None]  # (under way: nothing said yet)
    script.server(b"250 ok\r\n250 ok\r\n550-5.1.1 no such user\r\n550 5.1.1 here\r\n")
    assert script.server(b"") == [Closed(None)]
    assert script.session.settled() == [None, Reply(550, "5.1.1", ("no such user", "here")), None]


def test_a_refused_mail_is_every_recipients_outcome_when_the_server_closes_after_it() -> None:
    script = greeted()
    script.send(Deliver(envelope("b@example.net", "c@example.net")))
    script.server(b"550 5.7.1 sender refused\r\n")
    script.server(b"")
    assert script.session.settled() == [Reply(550, "5.7.1", ("sender refused",))] * 2


def test_nothing_a_server_said_in_a_transaction_counts_once_it_broke_the_protocol() -> None:
    script = greeted()
    script.send(Deliver(envelope("b@example.net", "c@example.net")))
    with pytest.raises(ClientProtocolError):
        script.server(b"250 ok\r\n550 5.1.1 unknown\r\n354 what?\r\n")
    assert script.session.settled() == []


@pytest.mark.parametrize("pipelining", [True, False])
def test_a_421_anywhere_in_a_transaction_ends_the_session_even_if_the_server_goes_on(pipelining: bool) -> None:
    """RFC 5321 3.8: a 421 is the server closing the connection. Found from outside: a peer that
    answered one RCPT 421 and went on got RSET, MAIL ... on the same connection."""
    ehlo = EHLO_PLAIN if pipelining else b"250 mx.test\r\n"
    script = greeted(ehlo=ehlo)
    out = script.send(Deliver(envelope("b@example.net", "c@example.net", "d@example.net")))
    closing = Reply(421, "4.7.0", ("busy",))
    unknown = Reply(550, "5.1.1", ("unknown",))
    events = []
    for reply in (b"250 ok\r\n", b"550 5.1.1 unknown\r\n", b"421 4.7.0 busy\r\n"):
        events += script.server(reply)
    done, closed = events
    assert isinstance(done, TransactionDone)
    assert done.result.replies == [unknown, closing, closing]  # the refusal stands; the rest get the 421
    assert closed == Closed(closing)
    assert script.session.phase is Phase.CLOSED and not script.session.is_ready()
    assert script.server(b"250 ok\r\n250 queued\r\n") == []  # what it says after: not read
    everything = out + b"".join(script.writes)
    assert b"RCPT TO:<d@example.net>" in everything if pipelining else b"RCPT TO:<d@example.net>" not in everything
    assert not everything.endswith((b"QUIT\r\n", b"RSET\r\n", b"DATA\r\n"))
    with pytest.raises(SmtpUsageError):
        script.session.send(Deliver(envelope()))


def test_another_reply_while_idle_is_a_protocol_error() -> None:
    """A reply to no command: taken as the next MAIL's reply it would shift every reply after it."""
    script = greeted()
    with pytest.raises(ClientProtocolError, match="no command"):
        script.server(b"250 2.0.0 ok\r\n")
    assert script.session.phase is Phase.CLOSED
    assert script.session.next_event() == Closed(None)


def test_a_reply_after_the_last_of_a_transaction_is_a_protocol_error() -> None:
    script = greeted()
    script.send(Deliver(envelope()))
    script.session.receive_data(b"250 ok\r\n250 ok\r\n250 queued\r\n250 extra\r\n")
    assert isinstance(script.session.next_event(), TransactionDone)
    with pytest.raises(ClientProtocolError):
        script.session.next_event()


@pytest.mark.parametrize("phase_data", [b"", BANNER, BANNER + b"502 no\r\n"])
def test_the_server_closing_during_the_opening_closes_the_session(phase_data: bytes) -> None:
    script = Script.start()
    if phase_data:
        script.server(phase_data)
    assert script.server(b"") == [Closed(None)]


def test_the_server_closing_during_a_transaction_closes_the_session() -> None:
    script = greeted()
    script.send(Deliver(envelope()))
    assert script.server(b"250 ok\r\n") == []
    assert script.server(b"") == [Closed(None)]
    assert script.session.transactions == 0


def test_replies_before_the_close_are_read_first() -> None:
    script = greeted()
    script.send(Deliver(envelope()))
    events = script.server(b"250 ok\r\n250 ok\r\n250 queued\r\n421 4.4.2 bye\r\n")
    assert [type(e) for e in events] == [TransactionDone, Closed]
    script.session.receive_data(b"")
    assert script.session.next_event() == events[-1]


def test_bytes_after_the_session_closed_are_ignored() -> None:
    script = greeted()
    script.send(Quit())
    script.server(b"221 bye\r\n")
    assert script.server(b"garbage\r\n") == []
    assert script.session.next_event() == Closed(Reply(221, None, ("bye",)))


@pytest.mark.parametrize("garbage", [b"hello\r\n", b"2500 x\r\n", b"250-a\r\n550 b\r\n"])
def test_malformed_replies_are_protocol_errors_in_any_phase(garbage: bytes) -> None:
    for before in (b"", BANNER):
        script = Script.start()
        if before:
            script.server(before)
        with pytest.raises(ClientProtocolError):
            script.server(garbage)
        assert script.session.phase is Phase.CLOSED


# --- our mistakes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["", "two words", "tab\there", "new\r\nline", "caf\u00e9"])
def test_a_helo_name_that_cannot_go_on_the_wire_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="greet"):
        ClientSession(name)


def test_sending_mail_before_ready_is_a_usage_error() -> None:
    script = Script.start()
    with pytest.raises(SmtpUsageError, match="MAIL"):
        script.session.send(Deliver(envelope()))
    script.server(BANNER)
    with pytest.raises(SmtpUsageError):
        script.session.send(Deliver(envelope()))


def test_a_second_message_during_a_transaction_is_a_usage_error() -> None:
    script = greeted()
    script.send(Deliver(envelope()))
    with pytest.raises(SmtpUsageError):
        script.session.send(Deliver(envelope()))
    with pytest.raises(SmtpUsageError):
        script.session.send(Quit())


def test_tls_verdicts_without_a_starttls_are_usage_errors() -> None:
    script = greeted()
    with pytest.raises(SmtpUsageError):
        script.session.tls_established()
    with pytest.raises(SmtpUsageError):
        script.session.tls_failed("x")


def test_sending_something_else_is_a_usage_error() -> None:
    script = greeted()
    # (Compiled by mypyc, the session's send() checks its argument's type itself: TypeError.)
    with pytest.raises((SmtpUsageError, TypeError)):
        script.session.send("QUIT")  # type: ignore[arg-type]


def test_an_unusable_event_checks_its_fields() -> None:
    with pytest.raises(ValueError, match="needs"):
        Unusable(Reason.BANNER)
    with pytest.raises(ValueError, match="takes no"):
        Unusable(Reason.TLS_NOT_OFFERED, Reply(250, None, ("x",)))
    with pytest.raises(ValueError, match="clear"):
        Unusable(Reason.TLS_REFUSED, Reply(454, None, ("x",)), retry_in_clear=True)


# --- the policy, exhaustively ---------------------------------------------------------------------
SERVERS = {
    "no-starttls": (EHLO_PLAIN, None, None),
    "starttls": (EHLO_TLS, b"220 go\r\n", True),
    "starttls-refused": (EHLO_TLS, b"454 4.7.0 no\r\n", None),
    "starttls-handshake-fails": (EHLO_TLS, b"220 go\r\n", False),
    "helo-only": (b"502 no\r\n250 mx.test\r\n", None, None),
}
EXPECTED = {  # (policy, server) -> what happens: "clear", "tls", or the Unusable reason
    (TlsPolicy.DISABLED, "no-starttls"): "clear",
    (TlsPolicy.DISABLED, "starttls"): "clear",
    (TlsPolicy.DISABLED, "starttls-refused"): "clear",
    (TlsPolicy.DISABLED, "starttls-handshake-fails"): "clear",
    (TlsPolicy.DISABLED, "helo-only"): "clear",
    (TlsPolicy.OPPORTUNISTIC, "no-starttls"): "clear",
    (TlsPolicy.OPPORTUNISTIC, "starttls"): "tls",
    (TlsPolicy.OPPORTUNISTIC, "starttls-refused"): "clear",
    (TlsPolicy.OPPORTUNISTIC, "starttls-handshake-fails"): Reason.TLS_FAILED,
    (TlsPolicy.OPPORTUNISTIC, "helo-only"): "clear",
    (TlsPolicy.REQUIRED, "no-starttls"): Reason.TLS_NOT_OFFERED,
    (TlsPolicy.REQUIRED, "starttls"): "tls",
    (TlsPolicy.REQUIRED, "starttls-refused"): Reason.TLS_REFUSED,
    (TlsPolicy.REQUIRED, "starttls-handshake-fails"): Reason.TLS_FAILED,
    (TlsPolicy.REQUIRED, "helo-only"): Reason.TLS_NOT_OFFERED,
}


def run_opening(policy: TlsPolicy, server: str) -> tuple[Script, Event]:
    greeting, starttls_answer, handshake_works = SERVERS[server]
    script = Script.start(policy)
    events = script.server(BANNER + greeting)
    if not events and starttls_answer is not None:
        events = script.server(starttls_answer)
        if events == [StartTls()]:
            if handshake_works:
                script.session.tls_established()
                script.pump()
                events = script.server(EHLO_AFTER_TLS)
            else:
                script.session.tls_failed("handshake failure")
                events = script.pump()
    (event,) = events
    return script, event


@pytest.mark.parametrize(("policy", "server"), list(EXPECTED), ids=[f"{p.value}-{s}" for p, s in EXPECTED])
def test_tls_policy_against_every_kind_of_server(policy: TlsPolicy, server: str) -> None:
    script, event = run_opening(policy, server)
    expected = EXPECTED[(policy, server)]
    if isinstance(expected, Reason):
        assert isinstance(event, Unusable)
        assert event.reason is expected
        assert event.retry_in_clear == (policy is TlsPolicy.OPPORTUNISTIC and expected is Reason.TLS_FAILED)
        # RFC 3463: a failed handshake is X.7.5 (cryptographic failure); no TLS to be had, X.7.4.
        assert event.explain("peer").enhanced == ("4.7.5" if expected is Reason.TLS_FAILED else "4.7.4")
    else:
        assert isinstance(event, Ready)
        assert event.tls == (expected == "tls")
    said_starttls = b"STARTTLS\r\n" in b"".join(script.writes)
    assert said_starttls == (policy is not TlsPolicy.DISABLED and SERVERS[server][0] == EHLO_TLS)


# --- however the bytes are cut ----------------------------------------------------------------
SEGMENTS = (
    BANNER + EHLO_TLS + b"220 2.0.0 go ahead\r\n",  # then the handshake
    EHLO_AFTER_TLS,  # then a message
    b"250 ok\r\n250-2.1.5 ok\r\n250 2.1.5 really\r\n354 go\r\n250 2.0.0 queued\r\n",  # then QUIT
    b"221 2.0.0 bye\r\n",
)


def converse(segments: list[list[bytes]]) -> tuple[bytes, list[Event]]:
    """The same conversation, each segment of the server's bytes cut as given: what the client
    wrote (how it is split into writes follows how the server's bytes came) and what it saw."""
    script = Script.start(TlsPolicy.REQUIRED, chunking=False)
    actions: list[Callable[[], object]] = [
        script.session.tls_established,
        lambda: script.send(Deliver(envelope())),
        lambda: script.send(Quit()),
        lambda: None,
    ]
    for pieces, action in zip(segments, actions, strict=True):
        for piece in pieces:
            script.server(piece)
        action()
        script.pump()
    return b"".join(script.writes), script.events


def cut(data: bytes, points: list[int]) -> list[bytes]:
    edges = [0, *sorted({p % (len(data) + 1) for p in points}), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(min_value=0), max_size=10), min_size=4, max_size=4))
def test_the_server_bytes_cut_anywhere_give_the_same_writes_and_events(points: list[list[int]]) -> None:
    whole = converse([[segment] for segment in SEGMENTS])
    assert converse([cut(segment, p) for segment, p in zip(SEGMENTS, points, strict=True)]) == whole


def test_the_whole_conversation_is_what_a_server_expects() -> None:
    written, events = converse([[segment] for segment in SEGMENTS])
    assert written == (
        b"EHLO client.test\r\nSTARTTLS\r\nEHLO client.test\r\n"
        b"MAIL FROM:<a@example.org> SIZE=18\r\nRCPT TO:<b@example.net>\r\nDATA\r\n" + BODY + b".\r\nQUIT\r\n"
    )
    assert [type(e) for e in events] == [StartTls, Ready, TransactionDone, Closed]
