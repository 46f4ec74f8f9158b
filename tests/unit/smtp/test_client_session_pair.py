"""The client session against Pigeon's own server session, back to back (see `link.py`).

Each test runs a real conversation, every byte produced by one side and parsed by the other,
and asserts what each side saw: the client's events and writes, the server's events, replies
and stored content.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.smtp import replies
from pigeon.smtp.client import Capabilities, Envelope, Recipient
from pigeon.smtp.client_session import Closed, Deliver, Phase, Ready, Reason, TlsPolicy, TransactionDone, Unusable
from pigeon.smtp.client_session import StartTls as ClientStartTls
from pigeon.smtp.events import Ehlo, Helo, MailFrom, StartTls, TransactionReset
from pigeon.smtp.replies import Reply
from pigeon.smtp.server import Phase as ServerPhase

from .harness import HOSTNAME, QUEUED, config
from .link import Link

BODY = b"Subject: pair\r\n\r\nhello\r\n.dot\r\n"
ALL_OFFERED = frozenset({"PIPELINING", "SIZE", "8BITMIME", "SMTPUTF8", "ENHANCEDSTATUSCODES", "CHUNKING", "DSN"})
USER_UNKNOWN = Reply(550, "5.1.1", ("User unknown",))
QUEUED_REPLY = Reply(250, "2.0.0", (QUEUED[10:-2],))
STUFFED = b"Subject: pair\r\n\r\nhello\r\n..dot\r\n.\r\n"  # BODY as DATA sends it


def envelope(*recipients: str, body: bytes = BODY) -> Envelope:
    return Envelope("a@example.org", [Recipient(r) for r in recipients or ("b@example.net",)], body)


def server_kinds(link: Link) -> list[str]:
    return [type(event).__name__ for event in link.server.events]


# --- greeting -------------------------------------------------------------------------------
def test_banner_and_ehlo_give_the_client_what_the_server_offers() -> None:
    link = Link.open(config(max_message_size=5000), tls=TlsPolicy.DISABLED)
    assert link.events == [Ready(Capabilities(ALL_OFFERED, size=5000), tls=False)]
    assert link.client_writes == [b"EHLO client.test\r\n"]
    assert link.server.of_type(Ehlo) == [Ehlo("client.test")]
    assert link.server.session.phase is ServerPhase.READY


def test_a_server_refusing_ehlo_is_greeted_with_helo_and_gets_mail_without_extensions() -> None:
    refusal = Reply(502, "5.5.1", ("EHLO not here",))
    link = Link.open(answers={"EHLO": [refusal]})
    assert link.client_writes == [b"EHLO client.test\r\n", b"HELO client.test\r\n"]
    assert link.events == [Ready(Capabilities.helo_only(), tls=False)]
    assert [type(e) for e in link.server.events if isinstance(e, (Ehlo, Helo))] == [Ehlo, Helo]
    assert not link.server.session.esmtp

    result = link.deliver(envelope())
    assert result.replies == [QUEUED_REPLY]  # its enhanced code too: RFC 2034 4 sends them after HELO
    assert link.client_writes[2:] == [  # lock-step, DATA, no parameters: all a HELO server may take
        b"MAIL FROM:<a@example.org>\r\n",
        b"RCPT TO:<b@example.net>\r\n",
        b"DATA\r\n",
        STUFFED,
    ]
    assert link.server.of_type(MailFrom) == [MailFrom("a@example.org")]
    assert link.messages() == [BODY]


def test_a_server_refusing_ehlo_and_helo_is_unusable_and_hears_quit() -> None:
    no = Reply(550, "5.7.1", ("Go away",))
    link = Link.open(answers={"EHLO": [no], "HELO": [no]})
    assert link.events == [Unusable(Reason.GREETING, no)]
    assert link.client_writes[-1] == b"QUIT\r\n"
    assert link.server.closing() is not None
    assert link.server_writes[-1] == replies.closing(HOSTNAME).encode()


# --- STARTTLS, under each policy --------------------------------------------------------------
@pytest.mark.parametrize("policy", [TlsPolicy.OPPORTUNISTIC, TlsPolicy.REQUIRED])
def test_starttls_offered_is_used_and_the_capabilities_are_those_of_the_ehlo_on_tls(policy: TlsPolicy) -> None:
    link = Link.open(config(tls_available=True), tls=policy)
    assert link.client_writes == [b"EHLO client.test\r\n", b"STARTTLS\r\n", b"EHLO client.test\r\n"]
    assert server_kinds(link) == ["Ehlo", "StartTls", "Ehlo"]
    assert link.server.session.tls_active
    (ready,) = link.events[1:]
    assert ready == Ready(Capabilities(ALL_OFFERED, size=config().max_message_size), tls=True)
    assert "STARTTLS" not in ready.capabilities  # the first EHLO's offer was forgotten (RFC 3207 4.2)
    assert link.deliver(envelope()).replies == [QUEUED_REPLY]


def test_disabled_tls_never_says_starttls_to_a_server_that_offers_it() -> None:
    link = Link.open(config(tls_available=True), tls=TlsPolicy.DISABLED)
    assert link.server.of_type(StartTls) == []
    (ready,) = link.events
    assert isinstance(ready, Ready) and not ready.tls and "STARTTLS" in ready.capabilities


@pytest.mark.parametrize("policy", [TlsPolicy.OPPORTUNISTIC, TlsPolicy.DISABLED])
def test_without_starttls_offered_mail_goes_in_the_clear_unless_tls_is_required(policy: TlsPolicy) -> None:
    link = Link.open(config(tls_available=False), tls=policy)
    (ready,) = link.events
    assert isinstance(ready, Ready) and not ready.tls
    assert link.deliver(envelope()).replies == [QUEUED_REPLY]
    assert not link.server.session.tls_active


def test_required_tls_without_starttls_offered_sends_nothing_but_quit() -> None:
    link = Link.open(config(tls_available=False), tls=TlsPolicy.REQUIRED)
    assert link.events == [Unusable(Reason.TLS_NOT_OFFERED)]
    assert link.client_writes == [b"EHLO client.test\r\n", b"QUIT\r\n"]
    assert link.server.closing() is not None


def test_starttls_refused_under_opportunistic_tls_goes_on_in_the_clear() -> None:
    link = Link.open(config(tls_available=True), answers={"STARTTLS": [replies.TLS_UNAVAILABLE]})
    assert link.client_writes == [b"EHLO client.test\r\n", b"STARTTLS\r\n"]
    (ready,) = link.events
    assert isinstance(ready, Ready) and not ready.tls
    assert link.deliver(envelope()).replies == [QUEUED_REPLY]
    assert link.messages() == [BODY]
    assert not link.server.session.tls_active


def test_starttls_refused_under_required_tls_is_unusable_with_the_servers_reply() -> None:
    link = Link.open(
        config(tls_available=True), tls=TlsPolicy.REQUIRED, answers={"STARTTLS": [replies.TLS_UNAVAILABLE]}
    )
    (event,) = link.events
    assert event == Unusable(Reason.TLS_REFUSED, replies.TLS_UNAVAILABLE)
    assert event.explain("mx.test [127.0.0.1]:25") == Reply(
        451, "4.7.4", ("TLS required, mx.test [127.0.0.1]:25 refused STARTTLS: 454 4.7.0 TLS not available",)
    )
    assert link.client_writes[-1] == b"QUIT\r\n"


@pytest.mark.parametrize(("policy", "retry"), [(TlsPolicy.OPPORTUNISTIC, True), (TlsPolicy.REQUIRED, False)])
def test_a_failed_handshake_ends_the_connection_and_says_whether_the_clear_may_follow(
    policy: TlsPolicy, retry: bool
) -> None:
    link = Link.open(config(tls_available=True), tls=policy, handshake=False)
    assert link.events == [
        ClientStartTls(),
        Unusable(Reason.TLS_FAILED, detail="handshake failure", retry_in_clear=retry),
    ]
    assert link.client_writes == [b"EHLO client.test\r\n", b"STARTTLS\r\n"]  # nothing in the clear after it

    if retry:  # what the I/O layer then does: a new connection that does not try TLS
        again = Link.open(config(tls_available=True), tls=TlsPolicy.DISABLED)
        assert again.deliver(envelope()).replies == [QUEUED_REPLY]


# --- transactions ---------------------------------------------------------------------------------
def test_a_pipelined_transaction_is_one_write_each_way() -> None:
    link = Link.open(tls=TlsPolicy.DISABLED)
    writes, answers = len(link.client_writes), len(link.server_writes)
    result = link.deliver(envelope("b@example.net", "c@example.net"))
    assert result.replies == [QUEUED_REPLY, QUEUED_REPLY]
    assert link.client_writes[writes:] == [
        b"MAIL FROM:<a@example.org> SIZE=30\r\nRCPT TO:<b@example.net>\r\nRCPT TO:<c@example.net>\r\n"
        b"BDAT 30 LAST\r\n" + BODY
    ]
    assert len(link.server_writes) - answers == 1
    assert link.messages() == [BODY]


def test_a_pipelined_data_transaction_is_two_writes() -> None:
    link = Link.open(tls=TlsPolicy.DISABLED, chunking=False)
    writes = len(link.client_writes)
    link.deliver(envelope())
    assert link.client_writes[writes:] == [
        b"MAIL FROM:<a@example.org> SIZE=30\r\nRCPT TO:<b@example.net>\r\nDATA\r\n",
        STUFFED,
    ]
    assert link.messages() == [BODY]


@pytest.mark.parametrize("pipelining", [True, False])
def test_rset_goes_before_the_next_transaction_after_an_unfinished_one(pipelining: bool) -> None:
    link = Link.open(config(pipelining=pipelining), tls=TlsPolicy.DISABLED)
    link.server.answer("RCPT", USER_UNKNOWN)
    first = link.deliver(envelope())
    assert first.replies == [USER_UNKNOWN]
    assert first.needs_reset and link.client.needs_reset

    writes = len(link.client_writes)
    assert link.deliver(envelope()).replies == [QUEUED_REPLY]
    sent = link.client_writes[writes:]
    assert sent[0].startswith(b"RSET\r\n")
    if pipelining:
        assert len(sent) == 1  # RSET rides with the transaction: no extra round trip
    assert link.server.of_type(TransactionReset)
    assert link.messages() == [BODY]


def test_no_rset_after_a_completed_transaction() -> None:
    link = Link.open(tls=TlsPolicy.DISABLED)
    link.deliver(envelope())
    writes = len(link.client_writes)
    link.deliver(envelope())
    assert not link.client_writes[writes].startswith(b"RSET")
    assert link.messages() == [BODY, BODY]


def test_many_messages_over_one_connection_then_quit() -> None:
    link = Link.open(config(tls_available=True), tls=TlsPolicy.REQUIRED)
    for n in range(5):
        assert link.deliver(envelope(f"r{n}@example.net")).replies == [QUEUED_REPLY]
    assert link.client.transactions == 5
    (closed,) = link.quit()
    assert closed == Closed(replies.closing(HOSTNAME))
    assert link.server.closing() is not None
    assert link.client.phase is Phase.CLOSED
    assert link.messages() == [BODY] * 5


def test_the_server_going_away_mid_transaction_closes_the_client_session() -> None:
    link = Link.open(config(max_messages_per_connection=1), tls=TlsPolicy.DISABLED)
    link.deliver(envelope())
    events = link.send(Deliver(envelope()))
    # 421 to MAIL: the transaction ends with it, as its recipients' reply, and so does the session.
    [done, closed] = events
    assert isinstance(done, TransactionDone) and [r.code for r in done.result.replies] == [421]
    assert isinstance(closed, Closed) and closed.reply is not None and closed.reply.code == 421
    assert link.server_writes[-1].startswith(b"421 4.7.0")


# --- any conversation stays in step ---------------------------------------------------------------
REFUSALS = st.sampled_from([None, None, USER_UNKNOWN, Reply(451, "4.3.0", ("later",))])


@st.composite
def transactions(draw: st.DrawFn) -> tuple[Envelope, Reply | None, list[Reply | None], Reply | None]:
    count = draw(st.integers(min_value=1, max_value=4))
    recipients = [f"r{n}@example.net" for n in range(count)]
    body = draw(st.sampled_from([BODY, b"", b".\r\n..\r\n", b"no final newline", (b"x" * 70 + b".\r\n") * 60]))
    return (
        envelope(*recipients, body=body),
        draw(st.sampled_from([None, None, None, Reply(550, "5.7.1", ("sender refused",))])),
        [draw(REFUSALS) for _ in recipients],
        draw(st.sampled_from([None, None, Reply(554, "5.7.0", ("content refused",))])),
    )


@settings(max_examples=150, deadline=None)
@given(
    plan=st.lists(transactions(), min_size=1, max_size=5),
    server_pipelining=st.booleans(),
    server_chunking=st.booleans(),
    client_pipelining=st.booleans(),
    client_chunking=st.booleans(),
    tls=st.sampled_from([policy for policy in TlsPolicy if policy is not TlsPolicy.IMPLICIT]),  # (no TLS link)
    server_tls=st.booleans(),
)
def test_any_sequence_of_transactions_keeps_both_sides_in_step(
    plan: list[tuple[Envelope, Reply | None, list[Reply | None], Reply | None]],
    server_pipelining: bool,
    server_chunking: bool,
    client_pipelining: bool,
    client_chunking: bool,
    tls: TlsPolicy,
    server_tls: bool,
) -> None:
    server = config(
        pipelining=server_pipelining, chunking=server_chunking, tls_available=server_tls, max_errors=1000
    )  # the refusals here are the test's doing: no "too many errors" hang-up
    link = Link.open(server, tls=tls, pipelining=client_pipelining, chunking=client_chunking)
    if tls is TlsPolicy.REQUIRED and not server_tls:
        assert link.events == [Unusable(Reason.TLS_NOT_OFFERED)]
        return
    (ready,) = link.events[-1:]
    assert isinstance(ready, Ready)
    assert ready.tls == (server_tls and tls is not TlsPolicy.DISABLED) == link.server.session.tls_active

    for env, mail_refusal, rcpt_refusals, end_refusal in plan:
        if mail_refusal is not None:
            link.server.answer("MAIL", mail_refusal)
        accepted_any = mail_refusal is None and None in rcpt_refusals
        for refusal in rcpt_refusals if mail_refusal is None else []:
            link.server.answer("RCPT", refusal or replies.RECIPIENT_OK)
        if end_refusal is not None and accepted_any:
            link.server.answer("MESSAGE", end_refusal)
        messages = len(link.messages())
        result = link.deliver(env)

        # Each recipient got the reply the server gave it, in order.
        for got, refusal in zip(result.replies, rcpt_refusals, strict=True):
            if mail_refusal is not None:
                assert got == mail_refusal
            elif refusal is not None:
                assert got == refusal
            else:
                expected = end_refusal or QUEUED_REPLY
                assert (got.code, got.text) == (expected.code, expected.text)
        # The content arrived whole when anyone was to have it, and not at all otherwise.
        if accepted_any:
            chunked = client_chunking and server_chunking
            assert link.messages()[messages:] == [env.body if chunked else _with_final_crlf(env.body)]
        else:
            assert len(link.messages()) == messages
        # Both sides are in step: the server answered everything, the client waits for nothing,
        # and it knows when the server still holds a transaction.
        assert link.server.unanswered_answers() == {}
        assert link.server.session.buffered == 0
        assert link.client.is_ready()
        if link.server.session.phase is not ServerPhase.READY:
            assert link.client.needs_reset

    (closed,) = link.quit()
    assert isinstance(closed, Closed) and closed.reply is not None and closed.reply.code == 221


def _with_final_crlf(body: bytes) -> bytes:
    return body if not body or body.endswith(b"\r\n") else body + b"\r\n"
