"""Property tests for the sans-IO SMTP server: whatever the peer sends, in whatever pieces,
the session answers with well-formed replies and never raises; and message content goes
through DATA and BDAT unchanged."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pigeon.smtp import replies
from pigeon.smtp.commands import Command, parse_command
from pigeon.smtp.errors import SmtpProtocolError
from pigeon.smtp.events import DataChunk, MessageEnd
from pigeon.smtp.extensions import Offer
from pigeon.smtp.framing import BareLinefeeds
from pigeon.smtp.replies import Reply
from pigeon.smtp.server import ServerConfig
from tests.unit.smtp.harness import QUEUED, REPLY_LINE, Peer, config, drive, open_data, open_transaction

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

COMMANDS = [
    b"EHLO client.test\r\n",
    b"HELO client.test\r\n",
    b"MAIL FROM:<a@example.org>\r\n",
    b"MAIL FROM:<> SIZE=100 BODY=8BITMIME RET=HDRS ENVID=x+2By\r\n",
    "MAIL FROM:<jürgen@example.org> SMTPUTF8\r\n".encode(),
    b"RCPT TO:<b@example.net>\r\n",
    b"RCPT TO:<c@example.net> NOTIFY=SUCCESS,FAILURE ORCPT=rfc822;c+40example.net\r\n",
    "RCPT TO:<ü@example.net>\r\n".encode(),
    b"DATA\r\n",
    b"BDAT 5\r\n",
    b"BDAT 3 LAST\r\n",
    b"BDAT 0 LAST\r\n",
    b"BDAT x\r\n",
    b"RSET\r\n",
    b"NOOP\r\n",
    b"VRFY x\r\n",
    b"HELP\r\n",
    b"EXPN x\r\n",
    b"STARTTLS\r\n",
    b"AUTH PLAIN AGFsaWNlAHB3\r\n",
    b"AUTH PLAIN\r\n",
    b"AUTH LOGIN\r\n",
    b"YWxpY2U=\r\n",
    b"*\r\n",
    b"QUIT\r\n",
    b".\r\n",
    b"..\r\n",
    b"\r\n.\r\n",
    b"\n.\n",
    b"\r.\r",
    b"hello\r\n",
]
_COMMAND = st.sampled_from(COMMANDS)
PIECES = st.one_of(
    _COMMAND,
    _COMMAND,
    _COMMAND,
    st.binary(max_size=40),
    st.sampled_from([b"\r", b"\n", b"\r\n", b".", b"\x00", b" ", b"<", b">", b":", b"=", b"\xff", b"x" * 1200]),
)
OPENINGS = st.sampled_from(
    [
        b"",
        b"EHLO client.test\r\n",
        b"EHLO client.test\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\n",
        b"EHLO client.test\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\nDATA\r\n",
        b"EHLO client.test\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\nDATA\r\nx\r\n.\r\n",
        b"EHLO client.test\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\nBDAT 5\r\nhello",
        b"EHLO client.test\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\nBDAT 2 LAST\r\nhi",
        b"EHLO client.test\r\nSTARTTLS\r\nEHLO client.test\r\nAUTH LOGIN\r\n",
    ]
)
CONFIGS = st.builds(
    ServerConfig,
    hostname=st.just("mx.test"),
    max_message_size=st.sampled_from([20, 1000, 25 * 1024 * 1024]),
    max_recipients=st.sampled_from([1, 100]),
    max_messages_per_connection=st.sampled_from([1, 100]),
    max_errors=st.sampled_from([0, 3, 20, 20]),
    bare_linefeeds=st.sampled_from(list(BareLinefeeds)),
    chunking=st.booleans(),
    tls_available=st.booleans(),
    auth_mechanisms=st.sampled_from([(), ("PLAIN", "LOGIN")]),
    auth_requires_tls=st.booleans(),
)
ANSWERS = st.lists(
    st.sampled_from(
        [
            None,
            None,
            None,
            replies.RELAY_DENIED,
            replies.SPOOL_ERROR,
            replies.AUTH_FAILED,
            Reply(421, "4.3.2", ("bye",)),
        ]
    ),
    max_size=20,
)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@FUZZ
@given(
    server=CONFIGS,
    opening=OPENINGS,
    pieces=st.lists(PIECES, max_size=30),
    cuts=st.lists(st.integers(min_value=0), max_size=10),
    answers=ANSWERS,
    eof=st.booleans(),
)
def test_any_input_gives_well_formed_replies_and_never_raises(
    server: ServerConfig, opening: bytes, pieces: list[bytes], cuts: list[int], answers: list[Reply | None], eof: bool
) -> None:
    out = drive(server, _split(opening + b"".join(pieces), cuts), answers, eof)
    assert out.startswith(b"220 mx.test ESMTP Pigeon\r\n")
    assert out.endswith(b"\r\n")
    for line in out.split(b"\r\n")[:-1]:
        assert REPLY_LINE.match(line), line


@FUZZ
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(min_value=0), max_size=10))
def test_random_bytes_after_ehlo_in_any_split_never_raise(data: bytes, cuts: list[int]) -> None:
    prefix = b"EHLO client.test\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\n"
    out = drive(config(), [prefix, *_split(data, cuts)], [], eof=True)
    for line in out.split(b"\r\n")[:-1]:
        assert REPLY_LINE.match(line), line


# --- content round trips --------------------------------------------------------------------
# Text lines as a client may send them: no CR or LF inside, and no NUL (refused by design).
LINE_TEXT = st.text(st.characters(blacklist_characters="\r\n\x00", codec="utf-8"), max_size=40).map(str.encode)
LINES = st.lists(
    st.one_of(
        LINE_TEXT,
        LINE_TEXT.map(lambda line: b"." + line),
        st.sampled_from([b"", b".", b"..", b". ", b"x" * 998, b"." + b"y" * 997]),
    ),
    max_size=25,
)


def _stuff(lines: list[bytes]) -> bytes:
    """What a client sends for these lines after DATA: dot-stuffed, then the terminator."""
    return b"".join((b"." if line.startswith(b".") else b"") + line + b"\r\n" for line in lines) + b".\r\n"


@FUZZ
@given(lines=LINES, cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_dot_stuffed_body_comes_out_of_data_unchanged(lines: list[bytes], cuts: list[int]) -> None:
    body = b"".join(line + b"\r\n" for line in lines)
    peer = Peer.start()
    open_data(peer)
    out = peer.send_pieces(_split(_stuff(lines) + b"NOOP\r\n", cuts))
    assert out == QUEUED + "250 2.0.0 Ok\r\n"
    assert peer.content() == body
    assert peer.message_ends() == [MessageEnd(len(body), chunked=False)]


@FUZZ
@given(
    lines=LINES,
    sizes=st.lists(st.integers(min_value=0, max_value=300), max_size=8),
    cuts=st.lists(st.integers(min_value=0), max_size=8),
)
def test_body_comes_out_of_bdat_unchanged(lines: list[bytes], sizes: list[int], cuts: list[int]) -> None:
    body = b"".join(line + b"\r\n" for line in lines)
    chunks: list[bytes] = []
    rest = body
    for size in sizes:
        chunks.append(rest[:size])
        rest = rest[size:]
    stream = b"".join(b"BDAT %d\r\n" % len(chunk) + chunk for chunk in chunks)
    stream += b"BDAT %d LAST\r\n" % len(rest) + rest + b"NOOP\r\n"
    peer = Peer.start()
    open_transaction(peer)
    out = peer.send_pieces(_split(stream, cuts))
    assert out.endswith(QUEUED + "250 2.0.0 Ok\r\n")
    assert out.count(" octets received\r\n") == len(chunks)
    assert b"".join(e.data for e in peer.events if isinstance(e, DataChunk)) == body
    assert peer.message_ends() == [MessageEnd(len(body), chunked=True)]


# --- the command parser ---------------------------------------------------------------------
OFFER = Offer(max_message_size=1000, starttls=True, auth_mechanisms=("PLAIN",))
VERBS = st.sampled_from(
    ["EHLO", "HELO", "MAIL", "RCPT", "DATA", "BDAT", "RSET", "NOOP", "QUIT", "VRFY", "HELP", "STARTTLS", "AUTH", "EXPN"]
)
ARGUMENTS = st.one_of(
    st.text(max_size=60),
    st.builds(
        lambda kw, path, params: f"{kw}<{path}>{params}",
        st.sampled_from(["FROM:", "TO:", "from: ", "TO:<"]),
        st.text(max_size=30),
        st.text(max_size=40),
    ),
    st.builds(
        lambda key, value: f"FROM:<a@b.c> {key}={value}",
        st.sampled_from(["SIZE", "BODY", "SMTPUTF8", "RET", "ENVID", "AUTH", "NOTIFY", "ORCPT", "X"]),
        st.text(max_size=20),
    ),
)


def _parse(line: bytes) -> None:
    result: Command | SmtpProtocolError
    try:
        result = parse_command(line, OFFER)
    except SmtpProtocolError as error:  # anything else propagates and fails the test
        result = error
    if isinstance(result, SmtpProtocolError):
        assert isinstance(result.reply, Reply)
        assert result.reply.code >= 500
    else:
        assert isinstance(result, Command)


@FUZZ
@given(line=st.binary(max_size=200))
def test_parser_on_arbitrary_bytes_gives_a_command_or_a_protocol_error(line: bytes) -> None:
    _parse(line)


@FUZZ
@given(verb=VERBS, argument=ARGUMENTS)
def test_parser_on_command_shaped_text_gives_a_command_or_a_protocol_error(verb: str, argument: str) -> None:
    _parse(f"{verb} {argument}".encode("utf-8", "surrogatepass"))
