"""The client session's AUTH step (a route relaying through a smart host), driven by scripted
server replies: each reply the server may give, each server that cannot be authenticated to.

What a server sees is asserted (the bytes written, AUTH after the EHLO on TLS and alone in its
write) and what the I/O layer is told: `Ready` once the server said 235, or `Unusable` with the
reply a delivery attempt records, always a 4xx (authentication never bounces mail) that never
holds the password.
"""

from __future__ import annotations

import base64

import pytest

from pigeon.smtp.client import ClientProtocolError
from pigeon.smtp.client_auth import Credentials
from pigeon.smtp.client_session import ClientSession, Deliver, Phase, Ready, Reason, StartTls, TlsPolicy, Unusable

from .test_client_session import BANNER, Script, envelope

PASSWORD = "s3cret-Pa55"
PEER = "smtp.example [192.0.2.7]:587"
EHLO_STARTTLS = b"250-relay.test\r\n250-PIPELINING\r\n250 STARTTLS\r\n"
EHLO_ON_TLS = b"250-relay.test\r\n250-PIPELINING\r\n250-AUTH LOGIN PLAIN CRAM-MD5\r\n250 SIZE 2000\r\n"
PLAIN = b"AUTH PLAIN " + base64.b64encode(b"\0alice\0" + PASSWORD.encode()) + b"\r\n"


def credentials(**options: object) -> Credentials:
    return Credentials("alice", PASSWORD, **options)  # type: ignore[arg-type]


def on_tls(ehlo: bytes = EHLO_ON_TLS, **options: object) -> Script:
    """A session that went through STARTTLS and sent its EHLO on TLS; `ehlo` is the answer."""
    script = Script(ClientSession("client.test", tls=TlsPolicy.REQUIRED, credentials=credentials(**options)))
    script.server(BANNER)
    assert script.server(EHLO_STARTTLS) == []
    assert script.server(b"220 2.0.0 go ahead\r\n") == [StartTls()]
    script.session.tls_established()
    script.pump()
    script.server(ehlo)
    return script


def explained(script: Script) -> str:
    (event,) = [e for e in script.events if isinstance(e, Unusable)]
    assert event.authentication
    return str(event.explain(PEER))


def test_plain_goes_with_its_initial_response_after_the_ehlo_on_tls_alone_in_its_write() -> None:
    script = on_tls()
    assert script.writes[-2:] == [b"EHLO client.test\r\n", PLAIN]
    assert script.session.phase is Phase.AUTH
    (ready,) = script.server(b"235 2.7.0 Authentication successful\r\n")
    assert isinstance(ready, Ready) and ready.tls
    assert script.session.auth_user == "alice"
    mail = script.send(Deliver(envelope()))
    assert mail.startswith(b"MAIL FROM:")  # AUTH once: the first transaction goes on at once


def test_login_answers_each_334_with_the_next_of_user_and_password() -> None:
    script = on_tls(mechanisms=("LOGIN",))
    assert script.last_write() == b"AUTH LOGIN\r\n"
    assert script.server(b"334 VXNlcm5hbWU6\r\n") == []
    assert script.last_write() == base64.b64encode(b"alice") + b"\r\n"
    assert script.server(b"334 UGFzc3dvcmQ6\r\n") == []
    assert script.last_write() == base64.b64encode(PASSWORD.encode()) + b"\r\n"
    (ready,) = script.server(b"235 2.7.0 ok\r\n")
    assert isinstance(ready, Ready)


def test_the_first_of_the_routes_mechanisms_that_the_server_offers_is_used() -> None:
    assert on_tls(mechanisms=("LOGIN", "PLAIN")).last_write() == b"AUTH LOGIN\r\n"
    offers_login = b"250-relay.test\r\n250 AUTH LOGIN\r\n"
    assert on_tls(offers_login).last_write() == b"AUTH LOGIN\r\n"  # PLAIN preferred, LOGIN all there is


def test_535_bad_credentials_is_unusable_as_a_4xx_naming_the_user_and_not_the_password() -> None:
    script = on_tls()
    (event,) = script.server(b"535 5.7.8 Authentication credentials invalid\r\n")
    assert isinstance(event, Unusable) and event.reason is Reason.AUTH_FAILED
    assert script.last_write() == b"QUIT\r\n"
    said = explained(script)
    assert said == (
        f"451 4.7.8 authentication as alice failed: {PEER} answered AUTH PLAIN with: "
        "535 5.7.8 Authentication credentials invalid"
    )
    assert PASSWORD not in said and PASSWORD not in repr(event) and PASSWORD not in repr(script.session.credentials)


@pytest.mark.parametrize(
    ("reply", "enhanced"),
    [
        (b"454 4.7.0 Temporary authentication failure\r\n", "4.7.0"),
        (b"504 5.5.4 Unrecognized authentication type\r\n", "4.5.4"),
        (b"535 Authentication failed\r\n", "4.7.0"),  # no enhanced code of its own
    ],
)
def test_any_refusal_of_auth_is_a_transient_failure_of_the_connection(reply: bytes, enhanced: str) -> None:
    script = on_tls()
    (event,) = script.server(reply)
    assert isinstance(event, Unusable) and event.reason is Reason.AUTH_FAILED
    explanation = event.explain(PEER)
    assert (explanation.code, explanation.enhanced) == (451, enhanced)
    assert reply.decode().strip() in explanation.text


def test_a_421_to_auth_is_the_server_closing() -> None:
    script = on_tls()
    (event,) = script.server(b"421 4.3.2 Shutting down\r\n")
    assert isinstance(event, Unusable) and event.reason is Reason.CLOSING and event.detail == "AUTH"


def test_a_server_that_does_not_offer_auth_is_unusable_and_nothing_is_sent() -> None:
    script = on_tls(b"250-relay.test\r\n250 PIPELINING\r\n")
    assert script.last_write() == b"QUIT\r\n"
    assert not any(b"AUTH" in write for write in script.writes)
    assert explained(script) == f"451 4.7.0 authentication as alice failed: {PEER} does not offer AUTH"


def test_a_server_offering_only_mechanisms_we_do_not_speak_is_unusable() -> None:
    script = on_tls(b"250-relay.test\r\n250 AUTH CRAM-MD5 XOAUTH2\r\n")
    assert not any(b"AUTH" in write for write in script.writes)
    assert explained(script) == (
        f"451 4.7.0 authentication as alice failed: {PEER} offers AUTH CRAM-MD5 XOAUTH2, none of PLAIN, LOGIN"
    )


@pytest.mark.parametrize(
    "broken",
    [
        b"250 2.0.0 ok\r\n",  # a positive reply AUTH cannot have
        b"334 \r\n",  # a challenge to PLAIN's initial response: nothing more to say
        b"23x nonsense\r\n",
    ],
)
def test_a_broken_reply_to_auth_is_a_protocol_error_and_nothing_more_is_said(broken: bytes) -> None:
    script = on_tls()
    script.session.receive_data(broken)
    with pytest.raises(ClientProtocolError):
        script.session.next_event()
    assert script.session.phase is Phase.CLOSED
    assert script.session.data_to_send() == b""


def test_a_third_challenge_to_login_is_a_protocol_error() -> None:
    script = on_tls(mechanisms=("LOGIN",))
    script.server(b"334 VXNlcm5hbWU6\r\n")
    script.server(b"334 UGFzc3dvcmQ6\r\n")
    script.session.receive_data(b"334 TW9yZTo=\r\n")
    with pytest.raises(ClientProtocolError, match="no more challenge"):
        script.session.next_event()


@pytest.mark.parametrize(
    "ehlo",
    [b"250-relay.test\r\n250 AUTH PLAIN\r\n", b"250-relay.test\r\n250-STARTTLS\r\n250 AUTH PLAIN\r\n"],
)
def test_without_tls_auth_is_never_sent_unless_the_route_allows_the_clear(ehlo: bytes) -> None:
    # Opportunistic: STARTTLS not offered, or refused; DISABLED: never asked for.
    for policy in (TlsPolicy.OPPORTUNISTIC, TlsPolicy.DISABLED):
        script = Script(ClientSession("client.test", tls=policy, credentials=credentials()))
        script.server(BANNER)
        script.server(ehlo)
        if script.session.phase is Phase.STARTTLS:
            script.server(b"454 4.7.0 TLS not available\r\n")
        assert not any(b"AUTH" in write for write in script.writes)
        (event,) = [e for e in script.events if isinstance(e, Unusable)]
        assert event.reason is Reason.AUTH_NEEDS_TLS
        assert event.explain(PEER).enhanced == "4.7.11"
    allowed = Script(ClientSession("client.test", tls=TlsPolicy.DISABLED, credentials=credentials(plaintext=True)))
    allowed.server(BANNER)
    allowed.server(b"250-relay.test\r\n250 AUTH PLAIN\r\n")
    assert allowed.last_write() == PLAIN


@pytest.mark.parametrize(
    "ehlo", [b"250-relay.test\r\n250 AUTH PLAIN\r\n", b"250-relay.test\r\n250-STARTTLS\r\n250 AUTH PLAIN\r\n"]
)
def test_credentials_allowing_the_clear_still_never_send_it_on_an_opportunistic_session(ehlo: bytes) -> None:
    # (The config allows the clear with tls = "disabled" only; the session holds to it too.)
    script = Script(ClientSession("client.test", tls=TlsPolicy.OPPORTUNISTIC, credentials=credentials(plaintext=True)))
    script.server(BANNER)
    script.server(ehlo)
    if script.session.phase is Phase.STARTTLS:
        script.server(b"454 4.7.0 TLS not available\r\n")
    assert not any(b"AUTH" in write for write in script.writes)
    (event,) = [e for e in script.events if isinstance(e, Unusable)]
    assert event.reason is Reason.AUTH_NEEDS_TLS


def test_a_failed_handshake_of_a_session_that_authenticates_is_not_to_be_retried_in_the_clear() -> None:
    # STARTTLS stripping: a 220 to STARTTLS, then a handshake that breaks.
    for plaintext in (False, True):
        script = Script(
            ClientSession("client.test", tls=TlsPolicy.OPPORTUNISTIC, credentials=credentials(plaintext=plaintext))
        )
        script.server(BANNER)
        script.server(EHLO_STARTTLS)
        assert script.server(b"220 2.0.0 go ahead\r\n") == [StartTls()]
        script.session.tls_failed("connection reset by the server")
        script.pump()
        (event,) = [e for e in script.events if isinstance(e, Unusable)]
        assert event.reason is Reason.TLS_FAILED and not event.retry_in_clear
    anonymous = Script(ClientSession("client.test", tls=TlsPolicy.OPPORTUNISTIC))
    anonymous.server(BANNER)
    anonymous.server(EHLO_STARTTLS)
    anonymous.server(b"220 2.0.0 go ahead\r\n")
    anonymous.session.tls_failed("connection reset by the server")
    anonymous.pump()
    (event,) = [e for e in anonymous.events if isinstance(e, Unusable)]
    assert event.retry_in_clear  # (mail without AUTH may still go in the clear: opportunistic TLS)


def test_implicit_tls_is_on_tls_from_the_banner_and_authenticates_after_the_first_ehlo() -> None:
    script = Script(ClientSession("client.test", tls=TlsPolicy.IMPLICIT, credentials=credentials()))
    script.server(BANNER)
    assert script.writes == [b"EHLO client.test\r\n"]
    script.server(b"250-relay.test\r\n250-STARTTLS\r\n250 AUTH PLAIN\r\n")  # STARTTLS offered: not said on TLS
    assert script.writes[-1] == PLAIN
    (ready,) = script.server(b"235 2.7.0 ok\r\n")
    assert ready == Ready(script.session.capabilities, tls=True)


def test_a_route_without_credentials_says_no_auth_even_when_offered() -> None:
    script = Script(ClientSession("client.test", tls=TlsPolicy.IMPLICIT))
    script.server(BANNER)
    (ready,) = script.server(b"250-relay.test\r\n250 AUTH PLAIN\r\n")
    assert isinstance(ready, Ready) and script.session.auth_user is None


@pytest.mark.parametrize(
    ("username", "password"), [("", "x"), ("al\nice", "x"), ("alice", ""), ("alice", "pa\0ss"), ("alice", "a\r\nb")]
)
def test_credentials_that_auth_cannot_carry_are_refused_without_showing_the_password(
    username: str, password: str
) -> None:
    with pytest.raises(ValueError, match=r"user name|password") as error:
        Credentials(username, password)
    assert not password or password not in str(error.value)


def test_credentials_refuse_a_mechanism_pigeon_does_not_speak() -> None:
    with pytest.raises(ValueError, match="CRAM-MD5"):
        Credentials("alice", "x", mechanisms=("CRAM-MD5",))


@pytest.mark.parametrize(
    "ehlo",
    [
        b"250-relay.test\r\n250 AUTH=PLAIN LOGIN\r\n",
        b"250-relay.test\r\n250-AUTH=LOGIN PLAIN\r\n250 AUTH PLAIN LOGIN\r\n",
    ],
)
def test_the_old_auth_equals_form_of_the_ehlo_reply_is_taken_as_auth(ehlo: bytes) -> None:
    # Old servers say "AUTH=PLAIN LOGIN" (RFC 2554's drafts), some beside "AUTH ...": Postfix takes both.
    assert on_tls(ehlo).last_write() == PLAIN


@pytest.mark.parametrize(
    ("ehlo", "refusal", "said"),
    [
        (b"250-relay.test\r\n250 AUTH PLAIN\r\n", None, f"{PEER} does not offer STARTTLS, and"),
        (
            b"250-relay.test\r\n250-STARTTLS\r\n250 AUTH PLAIN\r\n",
            b"454 4.7.0 TLS not available\r\n",
            f"{PEER} refused STARTTLS (454 4.7.0 TLS not available), and",
        ),
    ],
    ids=["not-offered", "refused"],
)
def test_an_opportunistic_session_without_tls_says_what_the_server_did_and_what_cures_it(
    ehlo: bytes, refusal: bytes | None, said: str
) -> None:
    # Not allow_plaintext_auth, which an opportunistic route is refused at load.
    script = Script(ClientSession("client.test", tls=TlsPolicy.OPPORTUNISTIC, credentials=credentials()))
    script.server(BANNER)
    script.server(ehlo)
    if refusal is not None:
        script.server(refusal)
    text = explained(script)
    assert text.startswith(f"451 4.7.11 authentication as alice not attempted: {said}")
    assert 'tls = "implicit"' in text and "allow_plaintext_auth" not in text
