"""An IMAP session against servers Dovecot does not play (tests/support/imap_server.py), through
real sockets: one that spells names and capabilities in lower case, one of IMAP4rev2 alone,
one whose certificate Pigeon cannot trust, one that refuses an XOAUTH2 token; and a server
that is not there. Each fails in a way that says what to change, or works."""

from __future__ import annotations

import errno
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme

from pigeon.inbound.imap import ConnectFailed, ImapError, ImapSession
from pigeon.tls import client_context
from tests.support.imap_server import ImapServer
from tests.support.ports import free_port

_MAIL = [b"Subject: one\r\n\r\nhello\r\n", b"Subject: two\r\n\r\nbye\r\n"]


async def _open(port: int, **options: Any) -> ImapSession:
    settings: dict[str, Any] = {
        "tls": "none", "tls_context": None, "username": "app", "secret": "secret", "auth": "login",
        "folder": "INBOX", "command_timeout": 5,
    } | options  # fmt: skip
    return await ImapSession.open("127.0.0.1", port, **settings)


async def _hand_over_and_remove(server: ImapServer, *, move: bool) -> None:
    """What a mailbox does with a server: search, sizes, bodies, then move or delete, and IDLE."""
    appended = server.append(_MAIL)
    session = await _open(server.port)
    try:
        uids = await session.search("UNSEEN UNDELETED NOT KEYWORD $PigeonDone")
        assert uids == appended
        assert await session.sizes(uids) == {uid: len(raw) for uid, raw in zip(uids, _MAIL, strict=True)}
        assert [raw for _, raw in (await session.fetch(uids)).values()] == _MAIL
        if move:
            await session.move(uids, "Done")
        else:
            await session.delete(uids)
        await session.wait_for_mail(0.2, idle=True)
    finally:
        await session.close()
    assert server.uids() == []


@pytest.mark.parametrize("quirk", ["capability", "all"])
async def test_capabilities_in_lower_case_are_the_same_capabilities(quirk: str) -> None:
    # Found from outside: "* CAPABILITY imap4rev1 idle uidplus move" had Pigeon say the server
    # "offers no UIDPLUS", use a plain EXPUNGE (which also removes the user's own \Deleted
    # messages), poll with NOOP instead of IDLE, and copy then expunge instead of MOVE.
    with ImapServer(lowercase=True if quirk == "all" else quirk) as server:
        session = await _open(server.port)
        try:
            assert all(session.has(name) for name in ("IDLE", "MOVE", "UIDPLUS", "idle"))
        finally:
            await session.close()
        await _hand_over_and_remove(server, move=True)
        assert server.received("UID MOVE") and not server.received("UID COPY")
        assert server.received("IDLE") and not server.received("NOOP")
        await _hand_over_and_remove(server, move=False)
        assert server.received("UID EXPUNGE") and not server.received("EXPUNGE")


async def test_a_server_of_imap4rev2_alone_is_spoken_to() -> None:
    # Found from outside: "the server's greeting: server not IMAP4 compliant", for ever. Its
    # searches are answered with ESEARCH, and IDLE, MOVE and UIDPLUS are part of IMAP4rev2
    # (RFC 9051), listed or not.
    for lowercase in (False, True):
        with ImapServer(rev2=True, lowercase=lowercase) as server:
            assert server.capabilities == ("IMAP4rev2", "AUTH=XOAUTH2")
            await _hand_over_and_remove(server, move=True)
            assert server.received("UID MOVE") and server.received("IDLE")
            await _hand_over_and_remove(server, move=False)
            assert server.received("UID EXPUNGE") and not server.received("EXPUNGE")


async def test_a_server_of_neither_imap4rev1_nor_imap4rev2_is_named_so() -> None:
    with (
        ImapServer(capabilities=("IMAP2", "IDLE")) as server,
        pytest.raises(
            ImapError, match="the server speaks neither IMAP4rev1 nor IMAP4rev2: its capabilities are IDLE IMAP2"
        ),
    ):
        await _open(server.port)


async def test_a_refused_xoauth2_token_is_said_to_be_the_token() -> None:
    # Found from outside: "login as app: NO [AUTHENTICATIONFAILED] Authentication failed.", as
    # for a wrong password, while the server's challenge said why: {"status":"401",...}.
    with ImapServer() as server:
        with pytest.raises(ImapError) as raised:
            await _open(server.port, auth="xoauth2", secret="expired-token")
        session = await _open(server.port, auth="xoauth2", secret="good-token")
        await session.close()
    assert str(raised.value) == (
        'login as app: auth = "xoauth2": the server refused the token (status 401, scope mail); refresh the token '
        "in password_file (the server said: NO [AUTHENTICATIONFAILED] Authentication failed.)"
    )
    assert server.tokens == ["expired-token", "good-token"]


@pytest.mark.parametrize(
    ("token", "said"),
    [
        ("", "the token is empty"),
        ("ya29.tökén", "the token holds a character that is not ASCII (at position 7 of 10)"),
        ("ya29 token", "the token holds white space or a control character (at position 5 of 10)"),
    ],
)
async def test_a_token_that_cannot_be_sent_is_refused_before_connecting(token: str, said: str) -> None:
    # An empty token was sent as a token (refused as a wrong one); one not ASCII raised a bare
    # UnicodeEncodeError.
    with ImapServer() as server, pytest.raises(ImapError) as raised:
        await _open(server.port, auth="xoauth2", secret=token)
    assert str(raised.value).startswith(f'login as app: auth = "xoauth2": {said}')
    assert "ö" not in str(raised.value) and not server.commands


async def test_a_server_that_is_not_there_is_named_with_its_address() -> None:
    # Found from outside: /healthz said "ConnectionRefusedError: [Errno 111] Connection refused".
    port = free_port()
    with pytest.raises(ConnectFailed) as raised:
        await _open(port)
    assert str(raised.value) == f"cannot connect to 127.0.0.1:{port}: Connection refused"
    assert raised.value.errno == errno.ECONNREFUSED  # (the mailbox knocks for its return)


def _ca(tmp_path: Path, name: str) -> tuple[Path, ssl.SSLContext]:
    ca = trustme.CA()
    pem = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(name).configure_cert(server)
    return pem, server


@pytest.mark.parametrize("tls", ["implicit", "starttls"])
async def test_a_certificate_pigeon_cannot_trust_names_the_server_and_the_setting(tmp_path: Path, tls: str) -> None:
    # Found from outside: "SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate
    # verify failed: unable to get local issuer certificate (_ssl.c:1006)", naming neither.
    pem, context = _ca(tmp_path, "127.0.0.1")
    quirk = {"tls": context} if tls == "implicit" else {"starttls": context}
    with ImapServer(**quirk) as server:
        with pytest.raises(ConnectFailed) as raised:
            await _open(server.port, tls=tls, tls_context=client_context(verify=True))
        session = await _open(server.port, tls=tls, tls_context=client_context(verify=True, cafile=pem))
        await session.close()
    assert str(raised.value) == (
        f"TLS to 127.0.0.1:{server.port} ({tls}): certificate not trusted: unable to get local issuer certificate; "
        "set ca_file to the PEM file of the CA that issued it (or tls_verify = false)"
    )


async def test_a_certificate_for_another_name_says_which_setting(tmp_path: Path) -> None:
    pem, context = _ca(tmp_path, "imap.example.com")
    with ImapServer(tls=context) as server, pytest.raises(ConnectFailed) as raised:
        await _open(server.port, tls="implicit", tls_context=client_context(verify=True, cafile=pem))
    assert str(raised.value).startswith(f"TLS to 127.0.0.1:{server.port} (implicit): certificate not trusted: ")
    assert str(raised.value).endswith("; set host to a name the certificate is for (or tls_verify = false)")
