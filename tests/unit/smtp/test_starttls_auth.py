"""STARTTLS (RFC 3207) and AUTH PLAIN / LOGIN (RFC 4954, 4616) through the ServerSession."""

from __future__ import annotations

import base64

import pytest

from pigeon.smtp import replies
from pigeon.smtp.events import NEED_DATA, AuthCredentials, Ehlo, MailFrom, Rejected, StartTls
from pigeon.smtp.server import ServerConfig, ServerSession

from .harness import HOSTNAME, Peer, config, lines

READY_TLS = "220 2.0.0 Ready to start TLS\r\n"
AUTH_OK = "235 2.7.0 Authentication successful\r\n"
BAD_ENCODING = "501 5.5.2 Invalid base64 or SASL message\r\n"
CANCELLED = "501 5.0.0 Authentication cancelled\r\n"
NEEDS_TLS = "538 5.7.11 Encryption required for requested authentication mechanism\r\n"
USERNAME_CHALLENGE = "334 VXNlcm5hbWU6\r\n"
PASSWORD_CHALLENGE = "334 UGFzc3dvcmQ6\r\n"


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode("ascii")


def tls_config(**overrides: object) -> ServerConfig:
    return config(tls_available=True, auth_mechanisms=("PLAIN", "LOGIN"), **overrides)


def ehlo_keywords(peer: Peer) -> list[str]:
    out = peer.send("EHLO client.test\r\n")
    return [line[4:] for line in lines(out)[1:]]


def authenticated_ready(**overrides: object) -> Peer:
    """A session on TLS that has said EHLO: AUTH is offered."""
    peer = Peer.start(tls_config(**overrides), tls_active=True)
    peer.send("EHLO client.test\r\n")
    return peer


def credentials(peer: Peer) -> list[AuthCredentials]:
    return [event for event in peer.events if isinstance(event, AuthCredentials)]


# --- STARTTLS -------------------------------------------------------------------------------
def test_starttls_is_not_offered_without_tls_available() -> None:
    peer = Peer.start()
    assert "STARTTLS" not in ehlo_keywords(peer)
    assert peer.send("STARTTLS\r\n") == "502 5.5.1 Command not implemented\r\n"
    assert peer.of_type(StartTls) == []


def test_starttls_is_offered_when_tls_is_available() -> None:
    peer = Peer.start(config(tls_available=True))
    assert ehlo_keywords(peer)[-1] == "STARTTLS"


def test_starttls_is_not_offered_once_tls_is_active() -> None:
    peer = Peer.start(config(tls_available=True), tls_active=True)
    assert "STARTTLS" not in ehlo_keywords(peer)
    assert peer.send("STARTTLS\r\n") == "503 5.5.1 TLS already active\r\n"


def test_starttls_before_ehlo_is_out_of_sequence() -> None:
    peer = Peer.start(config(tls_available=True))
    assert peer.send("STARTTLS\r\n") == "503 5.5.1 Send EHLO or HELO first\r\n"


def test_starttls_in_a_transaction_is_refused() -> None:
    peer = Peer.start(config(tls_available=True))
    peer.send("EHLO client.test\r\nMAIL FROM:<a@example.org>\r\n")
    assert peer.send("STARTTLS\r\n") == "503 5.5.1 STARTTLS not allowed during a mail transaction\r\n"


def test_starttls_with_an_argument_is_a_syntax_error() -> None:
    peer = Peer.start(config(tls_available=True))
    peer.send("EHLO client.test\r\n")
    assert peer.send("STARTTLS now\r\n") == "501 5.5.4 Syntax: STARTTLS takes no arguments\r\n"


def test_accepted_starttls_replies_220_and_discards_pipelined_commands() -> None:
    peer = Peer.start(config(tls_available=True))
    peer.send("EHLO client.test\r\n")
    assert peer.send("STARTTLS\r\nMAIL FROM:<a@example.org>\r\n") == READY_TLS
    peer.session.tls_established()
    assert peer.send(b"") == ""  # the injected MAIL is gone, not waiting to be answered
    assert peer.of_type(MailFrom) == []
    assert peer.send("MAIL FROM:<a@example.org>\r\n") == "503 5.5.1 Send EHLO or HELO first\r\n"
    assert peer.of_type(MailFrom) == []


def test_bytes_arriving_before_the_starttls_answer_are_discarded() -> None:
    session = ServerSession(config(tls_available=True))
    session.receive_data(b"EHLO client.test\r\n")
    assert session.next_event() == Ehlo("client.test")
    session.accept()
    session.receive_data(b"STARTTLS\r\n")
    assert session.next_event() == StartTls()
    session.receive_data(b"RSET\r\nMAIL FROM:<a@example.org>\r\n")  # before the 220 went out
    session.accept()
    session.receive_data(b"NOOP\r\n")  # plaintext during the handshake
    session.tls_established()
    assert session.next_event() is NEED_DATA
    assert session.data_to_send().endswith(b"250 STARTTLS\r\n" + READY_TLS.encode())
    peer = Peer(session)
    assert lines(peer.send("EHLO client.test\r\n"))[0] == "250-mx.test greets client.test"
    assert peer.of_type(MailFrom) == []


def test_session_starts_over_after_tls() -> None:
    peer = Peer.start(tls_config())
    assert "AUTH PLAIN LOGIN" not in ehlo_keywords(peer)
    peer.send("AUTH PLAIN " + b64("\0user\0pass") + "\r\n")
    assert peer.send("STARTTLS\r\n") == READY_TLS
    peer.session.tls_established()
    assert peer.send("NOOP\r\n") == "250 2.0.0 Ok\r\n"  # no EHLO yet on the new channel: codes all the same
    keywords = ehlo_keywords(peer)
    assert "STARTTLS" not in keywords
    assert keywords[-1] == "AUTH PLAIN LOGIN"
    assert peer.send("MAIL FROM:<a@example.org>\r\n") == "250 2.1.0 Sender ok\r\n"


def test_refused_starttls_keeps_the_session_in_plaintext() -> None:
    peer = Peer.start(config(tls_available=True))
    peer.send("EHLO client.test\r\n")
    peer.answer("STARTTLS", replies.TLS_UNAVAILABLE)
    assert peer.send("STARTTLS\r\nNOOP\r\n") == "454 4.7.0 TLS not available\r\n250 2.0.0 Ok\r\n"
    assert "STARTTLS" in ehlo_keywords(peer)


# --- AUTH offer -----------------------------------------------------------------------------
def test_auth_is_not_offered_without_tls_when_tls_is_required() -> None:
    peer = Peer.start(tls_config())
    assert not any(keyword.startswith("AUTH") for keyword in ehlo_keywords(peer))
    assert peer.send("AUTH PLAIN " + b64("\0user\0pass") + "\r\n") == NEEDS_TLS
    assert credentials(peer) == []


def test_auth_is_offered_with_tls() -> None:
    peer = Peer.start(tls_config(), tls_active=True)
    assert ehlo_keywords(peer)[-1] == "AUTH PLAIN LOGIN"


def test_auth_is_offered_without_tls_when_not_required() -> None:
    peer = Peer.start(tls_config(auth_requires_tls=False))
    assert ehlo_keywords(peer)[-2:] == ["STARTTLS", "AUTH PLAIN LOGIN"]
    assert peer.send("AUTH PLAIN " + b64("\0user\0pass") + "\r\n") == AUTH_OK


def test_auth_without_configured_mechanisms_is_refused() -> None:
    peer = Peer.start(config(), tls_active=True)
    peer.send("EHLO client.test\r\n")
    assert peer.send("AUTH PLAIN " + b64("\0user\0pass") + "\r\n") == "503 5.5.1 AUTH not available\r\n"


def test_auth_before_ehlo_is_out_of_sequence() -> None:
    peer = Peer.start(tls_config(), tls_active=True)
    assert peer.send("AUTH PLAIN " + b64("\0user\0pass") + "\r\n") == "503 5.5.1 Send EHLO or HELO first\r\n"


# --- AUTH PLAIN -----------------------------------------------------------------------------
def test_auth_plain_with_initial_response_gives_credentials() -> None:
    peer = authenticated_ready()
    assert peer.send("AUTH PLAIN " + b64("alice\0alice\0s3cr3t") + "\r\n") == AUTH_OK
    [creds] = credentials(peer)
    assert (creds.mechanism, creds.username, creds.password, creds.authzid) == ("PLAIN", "alice", "s3cr3t", "alice")


@pytest.mark.parametrize("with_initial_response", [True, False])
def test_auth_plain_asking_to_act_as_another_user_is_refused(with_initial_response: bool) -> None:
    """RFC 4616 2: an authzid other than the authcid asks for proxy authorization, which Pigeon
    does not have: 535 whatever the password, which is not even handed out to be checked."""
    peer = authenticated_ready()
    response = b64("bob\0alice\0s3cr3t")
    if with_initial_response:
        out = peer.send("AUTH PLAIN " + response + "\r\n")
    else:
        assert peer.send("AUTH PLAIN\r\n") == "334 \r\n"
        out = peer.send(response + "\r\n")
    assert out == "535 5.7.8 Authentication credentials invalid\r\n"
    assert credentials(peer) == []
    assert [(e.command, e.reply) for e in peer.of_type(Rejected)] == [("AUTH", replies.AUTH_FAILED)]
    assert peer.session.authenticated is None
    assert peer.send("AUTH PLAIN " + b64("\0alice\0s3cr3t") + "\r\n") == AUTH_OK  # and may try again


def test_auth_plain_mechanism_name_is_case_insensitive() -> None:
    peer = authenticated_ready()
    assert peer.send("auth plain " + b64("\0alice\0pw") + "\r\n") == AUTH_OK
    assert [c.username for c in credentials(peer)] == ["alice"]


def test_auth_plain_without_initial_response_asks_for_it() -> None:
    peer = authenticated_ready()
    assert peer.send("AUTH PLAIN\r\n") == "334 \r\n"
    assert credentials(peer) == []
    assert peer.send(b64("\0bob\0pw") + "\r\n") == AUTH_OK
    [creds] = credentials(peer)
    assert (creds.username, creds.password, creds.authzid) == ("bob", "pw", "")


def test_auth_plain_with_utf8_credentials() -> None:
    peer = authenticated_ready()
    assert peer.send("AUTH PLAIN " + b64("\0jürgen\0pässwört") + "\r\n") == AUTH_OK
    [creds] = credentials(peer)
    assert (creds.username, creds.password) == ("jürgen", "pässwört")


@pytest.mark.parametrize(
    "response",
    [
        pytest.param("not base64!", id="not-base64"),
        pytest.param("dXNlcg", id="missing-padding"),
        pytest.param(b64("user\0pass"), id="two-fields"),
        pytest.param(b64("\0\0pass"), id="empty-username"),
        pytest.param(b64(b"\0us\xffer\0pass"), id="not-utf8"),
        pytest.param("=", id="empty"),
    ],
)
def test_auth_plain_with_a_malformed_response_is_refused(response: str) -> None:
    peer = authenticated_ready()
    assert peer.send(f"AUTH PLAIN {response}\r\n") == BAD_ENCODING
    assert peer.send("AUTH PLAIN\r\n" + response + "\r\n") == "334 \r\n" + BAD_ENCODING
    assert credentials(peer) == []
    assert peer.send("NOOP\r\n") == "250 2.0.0 Ok\r\n"  # back to commands


def test_star_cancels_auth_plain() -> None:
    peer = authenticated_ready()
    assert peer.send("AUTH PLAIN\r\n*\r\n") == "334 \r\n" + CANCELLED
    assert peer.send("AUTH PLAIN *\r\n") == CANCELLED
    assert credentials(peer) == []
    assert peer.send("AUTH PLAIN " + b64("\0alice\0pw") + "\r\n") == AUTH_OK


# --- AUTH LOGIN -----------------------------------------------------------------------------
def test_auth_login_asks_for_username_then_password() -> None:
    peer = authenticated_ready()
    assert peer.send("AUTH LOGIN\r\n") == USERNAME_CHALLENGE
    assert peer.send(b64("carol") + "\r\n") == PASSWORD_CHALLENGE
    assert credentials(peer) == []
    assert peer.send(b64("hunter2") + "\r\n") == AUTH_OK
    [creds] = credentials(peer)
    assert (creds.mechanism, creds.username, creds.password) == ("LOGIN", "carol", "hunter2")


def test_auth_login_with_initial_username_asks_for_the_password() -> None:
    peer = authenticated_ready()
    assert peer.send("AUTH LOGIN " + b64("carol") + "\r\n") == PASSWORD_CHALLENGE
    assert peer.send(b64("hunter2") + "\r\n") == AUTH_OK
    assert [(c.username, c.password) for c in credentials(peer)] == [("carol", "hunter2")]


def test_auth_login_pipelined_in_one_write() -> None:
    peer = authenticated_ready()
    out = peer.send(f"AUTH LOGIN\r\n{b64('carol')}\r\n{b64('hunter2')}\r\nNOOP\r\n")
    assert out == USERNAME_CHALLENGE + PASSWORD_CHALLENGE + AUTH_OK + "250 2.0.0 Ok\r\n"


def test_star_cancels_auth_login_at_either_step() -> None:
    peer = authenticated_ready()
    assert peer.send("AUTH LOGIN\r\n*\r\n") == USERNAME_CHALLENGE + CANCELLED
    assert peer.send(f"AUTH LOGIN {b64('carol')}\r\n*\r\n") == PASSWORD_CHALLENGE + CANCELLED
    assert credentials(peer) == []


def test_auth_login_with_bad_base64_is_refused() -> None:
    peer = authenticated_ready()
    assert peer.send("AUTH LOGIN\r\n%%%\r\n") == USERNAME_CHALLENGE + BAD_ENCODING
    assert peer.send(f"AUTH LOGIN\r\n{b64('carol')}\r\n%%%\r\n") == (
        USERNAME_CHALLENGE + PASSWORD_CHALLENGE + BAD_ENCODING
    )
    assert credentials(peer) == []


def test_framing_error_during_a_sasl_exchange_ends_it() -> None:
    peer = authenticated_ready()
    assert peer.send("AUTH LOGIN\r\n") == USERNAME_CHALLENGE
    assert peer.send(b64("carol") + "\r\0\r\n") == "501 5.5.2 Command contains a bare <CR> and a NUL\r\n"
    # The client saw a final 5xx reply, so AUTH is over; its next line is a command.
    assert peer.send("MAIL FROM:<a@example.org>\r\n") == "250 2.1.0 Sender ok\r\n"


def test_a_sasl_response_ended_by_a_bare_lf_ends_the_session() -> None:
    peer = authenticated_ready()
    assert peer.send("AUTH LOGIN\r\n") == USERNAME_CHALLENGE
    assert peer.send(b64("carol") + "\nMAIL FROM:<a@example.org>\r\n").startswith("421 4.5.2 ")
    assert credentials(peer) == [] and peer.closing() is not None


# --- AUTH outcomes and sequence -------------------------------------------------------------
def test_refused_credentials_reply_535_and_allow_another_try() -> None:
    peer = authenticated_ready()
    peer.answer("AUTH", replies.AUTH_FAILED)
    assert (
        peer.send("AUTH PLAIN " + b64("\0alice\0wrong") + "\r\n") == "535 5.7.8 Authentication credentials invalid\r\n"
    )
    assert peer.send("AUTH PLAIN " + b64("\0alice\0right") + "\r\n") == AUTH_OK
    assert [c.password for c in credentials(peer)] == ["wrong", "right"]


def test_second_auth_after_success_is_refused() -> None:
    peer = authenticated_ready()
    assert peer.send("AUTH PLAIN " + b64("\0alice\0pw") + "\r\n") == AUTH_OK
    assert peer.send("AUTH LOGIN\r\n") == "503 5.5.1 Already authenticated\r\n"
    assert len(credentials(peer)) == 1


def test_auth_during_a_transaction_is_refused() -> None:
    peer = authenticated_ready()
    peer.send("MAIL FROM:<a@example.org>\r\n")
    assert peer.send("AUTH PLAIN " + b64("\0alice\0pw") + "\r\n") == (
        "503 5.5.1 AUTH not allowed during a mail transaction\r\n"
    )
    assert credentials(peer) == []
    assert peer.send("RCPT TO:<b@example.net>\r\n") == "250 2.1.5 Recipient ok\r\n"  # transaction intact


def test_unknown_mechanism_is_refused() -> None:
    peer = authenticated_ready()
    assert peer.send("AUTH CRAM-MD5\r\n") == "504 5.5.4 Unrecognized authentication mechanism\r\n"
    assert peer.send("AUTH\r\n") == "501 5.5.4 Syntax: AUTH mechanism [initial-response]\r\n"
    assert credentials(peer) == []


def test_credentials_never_show_the_password_in_their_repr() -> None:
    peer = authenticated_ready()
    peer.send("AUTH PLAIN " + b64("\0alice\0topsecret") + "\r\n")
    [creds] = credentials(peer)
    assert "topsecret" not in repr(creds)


def test_auth_success_is_kept_across_transactions_but_not_across_tls() -> None:
    peer = Peer.start(tls_config(auth_requires_tls=False))
    peer.send("EHLO client.test\r\n")
    assert peer.send("AUTH PLAIN " + b64("\0alice\0pw") + "\r\n") == AUTH_OK
    peer.send("MAIL FROM:<a@example.org>\r\nRSET\r\n")
    assert peer.send("AUTH PLAIN " + b64("\0alice\0pw") + "\r\n") == "503 5.5.1 Already authenticated\r\n"
    peer.send("STARTTLS\r\n")
    peer.session.tls_established()
    peer.send("EHLO client.test\r\n")
    assert peer.send("AUTH PLAIN " + b64("\0alice\0pw") + "\r\n") == AUTH_OK  # RFC 3207 4.2: forget it


def test_hostname_in_closing_reply() -> None:
    peer = authenticated_ready()
    assert peer.send("QUIT\r\n") == f"221 2.0.0 {HOSTNAME} closing connection\r\n"


@pytest.mark.parametrize(
    ("ending", "code"),
    [
        (b"\r\0\r\n", 501),  # a bare CR and a NUL
        (b"\0\r\n", 501),  # a NUL
        (b"\n", 421),  # a bare LF
        (b"x" * 13_000 + b"\r\n", 500),  # too long
    ],
)
def test_a_sasl_response_refused_as_a_line_is_reported_as_auth_and_none_of_it_as_the_verb(
    ending: bytes, code: int
) -> None:
    """The start of a SASL response is a credential's (base64 of a password): the refusal's
    verb, which the listener logs, is AUTH, not its first 16 octets."""
    peer = authenticated_ready()
    peer.send("AUTH LOGIN\r\n" + b64("carol") + "\r\n")
    assert peer.send_raw(b64("Secret-Passw0rd!").encode() + ending)[:3] == str(code).encode()
    assert [(event.command, event.reply.code) for event in peer.of_type(Rejected)] == [("AUTH", code)]
