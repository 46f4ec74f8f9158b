"""The SMTP client, sans-IO: parse replies, read EHLO, run one mail transaction.

The asyncio driver (`pigeon.delivery.session`) moves bytes; everything about what to send
and what a reply means is here, testable without a socket:

* `ReplyReader` turns server bytes into `Reply` values (multi-line, enhanced codes). A line
  longer than `_MAX_REPLY_LINE` is cut, not refused (Postfix's `line_length_limit`); a reply
  bigger than `_MAX_REPLY_BYTES` is a `ClientProtocolError`;
* `Capabilities` is what an EHLO reply offers;
* `Transaction` sends one message to its recipients. With PIPELINING it writes MAIL, every
  RCPT and DATA in one go (RFC 2920), with CHUNKING as well the content itself (`BDAT n
  LAST`, RFC 3030: one round trip per message); without, it goes command by command. It
  records one reply per recipient: the RCPT refusal, or the end-of-data reply. Success is a
  2xx, and only DATA may have a 354; any other positive reply (a 250 to DATA, a 354 to the
  end of data or to RCPT) is a `ClientProtocolError`, never a delivery. A BDAT answered as a
  command the server does not know (`BDAT_NOT_UNDERSTOOD`) is no verdict on the message: its
  recipients get a 4xx, and `Result.bdat_not_understood` says to send it again with DATA.

`refusal_before_sending()` says when a message cannot go to this peer at all (SMTPUTF8 not
offered to a message that needs it, too big for its SIZE, 8-bit data without 8BITMIME): a
permanent, explained bounce rather than a protocol violation at the next hop. SMTPUTF8 needed
by some recipients' addresses alone refuses those alone (`smtputf8_refused_apart()`): the
others go without it. (8-bit data is
first made 7-bit for such a peer where it can be, by the delivery: `delivery.seven_bit`.) One rule, by
the message and not by the door it came in at: only an envelope address that is not ASCII
truly needs SMTPUTF8 (it has no other form on the wire). UTF-8 in a header field asks for
SMTPUTF8 where the next hop offers it, and otherwise goes as 8-bit data with BODY=8BITMIME
(as a legacy client's raw Subject always has: Postfix's smtputf8_autodetect_classes keeps
such mail deliverable, KumoMTA refuses only an 8-bit envelope); with neither extension
offered it is refused for want of 8BITMIME (5.6.3): a header field has no 7-bit form. 8-bit
octets in a header section that is not UTF-8 (raw Latin-1) ask for no SMTPUTF8 at all: they
go with BODY=8BITMIME alone, or are refused alike.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Final

from pigeon.smtp.address import with_a_label
from pigeon.smtp.extensions import encode_xtext
from pigeon.smtp.framing import crlf_lines, find_line_dot
from pigeon.smtp.replies import Reply

_ENHANCED: Final = re.compile(r"[245]\.\d{1,3}\.\d{1,3}")
_MAX_REPLY_LINE: Final = 4096
"""The longest reply line kept, without its CRLF (RFC 5321 4.5.3.1.5 says 512; be generous). A
longer one is read to its end and cut there, as Postfix cuts at `line_length_limit`: a server
that sends one long line (an EHLO keyword with a long argument) is still a server to talk to."""
_MAX_REPLY_BYTES: Final = 1 << 20
"""Bytes in one reply, every line counted whole (the cut parts of long lines too). Past it the
reply is a protocol error: a server that sends a line or "250-" lines without end would
otherwise keep us reading (and, without the cut, buffering) for as long as it kept the
connection. An EHLO reply has a few hundred bytes."""
_MAX_REPLY_LINES: Final = 1000
"""Lines in one reply. An EHLO reply has a dozen."""
_CACHED_LINE: Final = 512  # RFC 5321 4.5.3.1.5: longer lines are odd, and not worth keeping
_LONGEST_EHLO_LINE: Final = 512  # RFC 5321 4.5.3.1.5 again: no extension we use needs more


class ClientProtocolError(Exception):
    """The server broke the protocol (its fault, not ours): a malformed reply, or a reply to
    no command. Give up on the connection."""


class ReplyReader:
    """Accumulates server bytes and returns complete replies.

    Memory stays bounded whatever the server sends: a line longer than `_MAX_REPLY_LINE` keeps
    its first `_MAX_REPLY_LINE` bytes (one more while it is read: that byte may be its CR) and
    the rest is dropped as it comes, up to the line's LF; a reply is at most
    `_MAX_REPLY_BYTES` received and `_MAX_REPLY_LINES` lines."""

    __slots__ = ("_buf", "_lines", "_partial", "_reply_bytes", "_skipping")

    def __init__(self) -> None:
        self._buf = bytearray()  # the start of a line whose LF has not come (at most _MAX_REPLY_LINE + 1 bytes)
        self._lines: list[str] = []  # the lines so far of a multi-line reply
        self._partial = 0  # bytes received of that unfinished line, the dropped ones included
        self._reply_bytes = 0  # bytes received of the reply's earlier lines (`_lines`)
        self._skipping = False  # the unfinished line is too long: what comes up to its LF is dropped

    def feed(self, data: bytes) -> list[Reply]:
        replies: list[Reply] = []
        buf = self._buf
        if self._skipping:
            end = data.find(b"\n")
            if end < 0:
                self._partial += len(data)
                self._check_size()
                return replies
            size = self._partial + end
            self._skipping, self._partial = False, 0
            kept = bytes(buf)
            buf.clear()
            reply = self._line(kept, size)
            if reply is not None:
                replies.append(reply)
            data = data[end + 1 :]
            if not data:
                return replies
        if buf:
            buf += data
            data = bytes(buf)
            buf.clear()
        *complete, rest = data.split(b"\n")
        for raw in complete:
            if not self._lines:
                # Servers say the same few things over and over ("250 2.1.0 Ok"): a line seen
                # before is a reply already checked and parsed.
                seen = _SEEN.get(raw)
                if seen is not None:
                    replies.append(seen)
                    continue
            reply = self._line(raw, len(raw))
            if reply is not None:
                replies.append(reply)
        if rest:
            self._partial = len(rest)
            if len(rest) > _MAX_REPLY_LINE + 1:
                # Too long whatever comes: keep what the cut keeps (and the byte after it, as a
                # complete line would have it) and drop the rest as it arrives.
                self._skipping = True
                buf += rest[: _MAX_REPLY_LINE + 1]
                self._check_size()
            else:
                buf += rest
        else:
            self._partial = 0
        return replies

    def _check_size(self) -> None:
        if self._reply_bytes + self._partial > _MAX_REPLY_BYTES:
            raise ClientProtocolError(f"a reply of more than {_MAX_REPLY_BYTES} bytes")

    def _line(self, raw: bytes, size: int) -> Reply | None:
        """Check one line (without its LF; `size` bytes long as received, before any cut); the
        reply if it is the last line of one."""
        self._reply_bytes += size + 1
        if self._reply_bytes > _MAX_REPLY_BYTES:
            raise ClientProtocolError(f"a reply of more than {_MAX_REPLY_BYTES} bytes")
        text = raw[:-1] if raw.endswith(b"\r") else raw
        if len(text) > _MAX_REPLY_LINE:
            text = text[:_MAX_REPLY_LINE]  # cut: what follows is dropped unread, as Postfix does
        line = text.decode("utf-8", "replace")
        code = line[:3]
        if len(code) < 3 or not (code.isascii() and code.isdigit()) or (len(line) > 3 and line[3] not in " -"):
            raise ClientProtocolError(f"malformed reply line {line[:80]!r}")
        if "\r" in line or "\0" in line:
            raise ClientProtocolError(f"reply line with a bare CR or NUL: {line[:80]!r}")
        lines = self._lines
        if lines and lines[0][0] != code[0]:
            # 250-... then 550: did the server take the command or not? No reading is safe.
            raise ClientProtocolError("reply class changed inside a multi-line reply")
        lines.append(line)
        if len(line) > 3 and line[3] == "-":
            if len(lines) >= _MAX_REPLY_LINES:
                raise ClientProtocolError(f"a reply of more than {_MAX_REPLY_LINES} lines")
            return None
        self._lines = []
        self._reply_bytes = 0
        reply = _parse_reply(lines)
        if len(lines) == 1 and size <= _CACHED_LINE:
            if len(_SEEN) > 4096:
                _SEEN.clear()
            _SEEN[raw] = reply  # (as received: never a cut line, `_CACHED_LINE` is shorter)
        return reply

    @property
    def buffered(self) -> bool:
        """Part of a reply has arrived and waits for the rest."""
        return bool(self._buf or self._lines or self._skipping)


_SEEN: dict[bytes, Reply] = {}  # single-line replies by their line as received


def _parse_reply(lines: list[str]) -> Reply:
    # The last line's code, as Postfix reads it: a server whose lines disagree within one class
    # (550-... then 551) said clearly enough whether it took the command, and refusing to read
    # it held every recipient of the transaction until it expired (found from outside).
    code = int(lines[-1][:3])
    if not 200 <= code <= 599:
        # RFC 5321 4.2: the first digit is 2 to 5. Another is no reply a client can act on: no
        # class says whether the command was done, and whatever Pigeon made of it would put
        # its own words in the server's mouth (a bounce "554 invalid reply code", once).
        raise ClientProtocolError(f"a reply with no valid code: {lines[0][:80]!r}")
    texts = [line[4:] for line in lines]
    enhanced = None
    first = texts[0].split(" ", 1)
    if _ENHANCED.fullmatch(first[0]) and first[0][0] == str(code)[0]:
        enhanced = first[0]
        texts = [_strip_enhanced(text, enhanced) for text in texts]
    return Reply(code, enhanced, tuple(t if t else "" for t in texts))


def _strip_enhanced(text: str, enhanced: str) -> str:
    return text[len(enhanced) + 1 :] if text.startswith(enhanced) else text


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an EHLO reply offers (keywords upper-cased)."""

    keywords: frozenset[str] = frozenset()
    size: int | None = None  # SIZE limit; None: not announced, 0: announced without a limit
    auth: tuple[str, ...] = ()
    esmtp: bool = True

    @classmethod
    def from_ehlo(cls, reply: Reply) -> Capabilities:
        keywords: set[str] = set()
        size: int | None = None
        auth: tuple[str, ...] = ()
        for line in reply.lines[1:]:
            if len(line) > _LONGEST_EHLO_LINE:
                # Longer than RFC 5321 allows, perhaps cut (`ReplyReader`): its parameters may
                # not be whole (a SIZE cut short, an AUTH mechanism cut in two), so it is not
                # used, and the keywords beside it are.
                continue
            parts = line.split()
            if not parts:
                continue
            keyword = parts[0].upper()
            if keyword.startswith("AUTH=") and not auth:
                # The form of RFC 2554's drafts ("250-AUTH=PLAIN LOGIN"), which old servers still
                # send, some beside "AUTH ...": taken as AUTH, as Postfix does, unless that came.
                keyword, parts = "AUTH", [keyword[:4], keyword[5:], *parts[1:]]
            keywords.add(keyword)
            if keyword == "SIZE":
                size = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            elif keyword == "AUTH":
                auth = tuple(p.upper() for p in parts[1:] if p)
        return cls(frozenset(keywords), size, auth)

    @classmethod
    def helo_only(cls) -> Capabilities:
        return cls(frozenset(), None, (), esmtp=False)

    def __contains__(self, keyword: str) -> bool:
        return keyword in self.keywords


@dataclass(frozen=True, slots=True)
class Recipient:
    address: str
    notify: tuple[str, ...] | None = None
    orcpt: str | None = None


@dataclass(slots=True)
class Envelope:
    """What a transaction needs to know about the message it sends."""

    sender: str
    recipients: list[Recipient]
    body: bytes  # the message as it goes on the wire: CRLF line endings, not dot-stuffed
    eight_bit: bool = False
    smtputf8: bool = False  # SMTPUTF8 asked for (by whoever gave us the message)
    ret: str | None = None
    envid: str | None = None
    needs_smtputf8: bool = field(init=False, default=False)
    """Whether the message cannot go without SMTPUTF8 (`needs_smtputf8()`): set from the rest."""
    wants_smtputf8: bool = field(init=False, default=False)
    """Whether MAIL says SMTPUTF8 where the peer offers it: asked for, needed, or UTF-8 in a
    header field (`utf8_header()`). Set from the rest."""

    def __post_init__(self) -> None:
        # Whatever the spool holds, no bare LF or CR goes out: a next hop that takes one for
        # a line end would read a dot after it as the end of the data, and the rest as
        # commands (SMTP smuggling). Made CRLF, every line is one that dot-stuffing sees, so
        # the only end of data is ours. Normalised rather than refused: the mail was accepted,
        # and its lines read the same to the recipient.
        body = crlf_lines(self.body)
        if body and not body.endswith(b"\r\n"):
            # DATA cannot end without a CRLF; BDAT sends the same bytes, so that a DKIM
            # signature (which hashes the body as if the CRLF were there) holds either way.
            body += b"\r\n"
        self.body = body
        self.needs_smtputf8 = needs_smtputf8(self.sender, self.recipients)
        self.wants_smtputf8 = self.smtputf8 or self.needs_smtputf8 or utf8_header(body)

    def only(self, indices: list[int]) -> Envelope:
        """This envelope for its recipients `indices` alone (the same message)."""
        return dataclasses.replace(self, recipients=[self.recipients[i] for i in indices])


def needs_smtputf8(sender: str, recipients: list[Recipient]) -> bool:
    """Whether a message must go with SMTPUTF8 (RFC 6531): an envelope address that is not
    ASCII (after its domain's A-label) has no other form in MAIL or RCPT, asked for or not.
    Nothing else does, whichever door the mail came in at: UTF-8 in a header field asks for
    SMTPUTF8 where it is offered (`Envelope.wants_smtputf8`) and otherwise goes as 8-bit data,
    with BODY=8BITMIME, as a legacy client's raw Subject always has."""
    if not with_a_label(sender).isascii():
        return True
    return not all(with_a_label(recipient.address).isascii() for recipient in recipients)


def utf8_header(body: bytes) -> bool:
    """Whether the header section of `body` (CRLF lines) is UTF-8 beyond ASCII (RFC 6532 3:
    SMTPUTF8 mail). 8-bit octets that are not UTF-8 (a legacy client's raw Latin-1 Subject)
    are not: SMTPUTF8 would tell the next hop to read them as UTF-8. They go as 8-bit data,
    as such mail always has, and as `pigeon.compose` reads an injected header alike. Only
    the header section is read (the body may be large; it is no header)."""
    if body.startswith(b"\r\n"):  # no header section at all
        return False
    end = body.find(b"\r\n\r\n")
    head = body if end < 0 else body[: end + 2]
    if head.isascii():
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass(slots=True)
class Result:
    """How a transaction ended, per recipient (in the envelope's order)."""

    replies: list[Reply]
    mail_reply: Reply | None = None
    data_reply: Reply | None = None
    needs_reset: bool = False  # the server still holds the transaction (MAIL accepted, no end of data)
    bdat_not_understood: Reply | None = None
    """The server's reply to BDAT when it did not know the command (`BDAT_NOT_UNDERSTOOD`,
    though it offers CHUNKING): the message was not taken, its accepted recipients have
    `data_reply` (`bdat_not_understood()`, a 4xx), and it may go again with DATA."""
    closing: Reply | None = None
    """The 421 that ended the transaction (`Transaction.closing`), or None. The replies in
    `replies` equal to it are it, as the server sent it."""
    closing_answered: str = ""
    """The command `closing` answered (`Transaction.unanswered`'s names: "MAIL FROM", "RCPT TO",
    "DATA", `END_OF_DATA`, "RSET"), for the I/O layer to say where the 421 came, as it does of
    one to EHLO; "" without a `closing`."""


NO_SMTPUTF8: Final = Reply(
    554, "5.6.7", ("Message needs SMTPUTF8 (internationalised addresses); the receiving server lacks it",)
)
"""What a recipient gets whose message needs SMTPUTF8 that the peer lacks: the whole message's
(`refusal_before_sending`), or that recipient's alone (`smtputf8_refused_apart`)."""


def refusal_before_sending(envelope: Envelope, peer: Capabilities) -> Reply | None:
    """A permanent reason this message cannot be sent to this peer at all, or None. (Only some
    of its recipients needing SMTPUTF8 is no such reason: `smtputf8_refused_apart`.)"""
    if envelope.needs_smtputf8 and "SMTPUTF8" not in peer:
        # Only an address needs it (`needs_smtputf8`): UTF-8 in a header field goes as 8-bit
        # data, and without 8BITMIME it is that refusal (5.6.3) below, at every door alike.
        return NO_SMTPUTF8
    if peer.size and len(envelope.body) > peer.size:
        text = f"Message of {len(envelope.body)} octets exceeds the receiving server's SIZE limit of {peer.size}"
        return Reply(552, "5.3.4", (text,))
    if envelope.eight_bit and "8BITMIME" not in peer:
        return Reply(554, "5.6.3", ("Message has 8-bit data and the receiving server does not offer 8BITMIME",))
    return None


def smtputf8_refused_apart(envelope: Envelope, peer: Capabilities) -> list[int]:
    """The recipients (by index) refused on their own at a peer without SMTPUTF8, while the
    others go: an address that is not ASCII has no form in RCPT without it (RFC 6531 3.4),
    but a RCPT is one recipient's, so only those are refused (`NO_SMTPUTF8`, each its own
    bounce), and the rest of the message goes in a transaction without SMTPUTF8, whose MAIL and
    RCPTs are ASCII. Empty when nothing is refused so: the peer offers SMTPUTF8, or no address
    needs it; and when the whole message is (`refusal_before_sending`): the sender needs it,
    so MAIL cannot go, or every recipient does."""
    if "SMTPUTF8" in peer or not envelope.needs_smtputf8 or not with_a_label(envelope.sender).isascii():
        return []
    refused = [i for i, recipient in enumerate(envelope.recipients) if not with_a_label(recipient.address).isascii()]
    return refused if len(refused) < len(envelope.recipients) else []


# What `rcpt_reply_read` adds to a 552's text (the README quotes it: the log's text ends so).
_READ_AS_452: Final = " (552 to RCPT read as 452, RFC 5321 4.5.3.1.10)"


def rcpt_reply_read(reply: Reply) -> Reply:
    """A RCPT reply as the client acts on it. RFC 821 gave 552 for "too many recipients",
    and servers still send it; RFC 5321 4.5.3.1.10 says a client SHOULD read a 552 to RCPT
    as 452, so the recipient goes in a later transaction rather than to a bounce (Postfix
    does the same). A 552 5.2.2 (mailbox full) is read as 452 4.2.2: a full mailbox may
    empty, and the retry schedule's expiry still ends it. The server's text stays, and says
    what was read, so a log reader sees the 552 (`rcpt_reply_as_sent` gives it back)."""
    if reply.code != 552:
        return reply
    enhanced = None if reply.enhanced is None else "4" + reply.enhanced[1:]
    return Reply(452, enhanced, (*reply.lines[:-1], f"{reply.lines[-1]}{_READ_AS_452}"))


def rcpt_reply_as_sent(said: str) -> str:
    """A reply in its one-line form (`str(reply)`, as a recipient's last reply is kept in the
    spool) as the server sent it: one `rcpt_reply_read` read as 452 is the server's 552 again,
    its enhanced class 5 and the note gone; any other is as it is. For what quotes the server to
    a program, a DSN's Diagnostic-Code (RFC 3464 2.3.6), which a parser reads the remote status
    from: a 452 there is a reply the server never gave (Postfix quotes the 552). What Pigeon
    made of it is said where a person reads it: the log record and the DSN's text keep the note."""
    if not (said.startswith("452 ") and said.endswith(_READ_AS_452)):
        return said
    rest = said[4 : -len(_READ_AS_452)]
    first, space, text = rest.partition(" ")
    if first.startswith("4.") and _ENHANCED.fullmatch(first):
        # The reader takes only a code of the reply's class: a 552's was 5.x.y. (A 552 with
        # none, whose text starts "4.x.y", is the one form this cannot tell: quoted "552 5.x.y".)
        rest = f"5{first[1:]}{space}{text}"
    return f"552 {rest}"


BDAT_NOT_UNDERSTOOD: Final = frozenset({500, 502, 504})
"""Replies to BDAT that say the command itself is not known (RFC 5321 4.2.4: unrecognised, not
implemented, a parameter not implemented), though the server offered CHUNKING: a broken
implementation, or a middlebox that mangles it. That says nothing of the message, which DATA
may deliver, unlike a content refusal after BDAT LAST (a 552 or 554), which stands."""


def bdat_not_understood(reply: Reply) -> Reply:
    """What the accepted recipients of a message whose BDAT was not understood get: a 4xx in
    the server's words (its enhanced class made 4), saying what happened and what comes next."""
    enhanced = "4.5.1" if reply.enhanced is None else "4" + reply.enhanced[1:]
    text = f"answered BDAT with {reply} (not understood, though CHUNKING is offered): to go again with DATA"
    return Reply(451, enhanced, (text,))


# What a pending reply answers.
_RSET, _MAIL, _RCPT, _DATA, _CONTENT = range(5)

END_OF_DATA: Final = "the end of data"
"""How `Transaction.unanswered` names the end of a message's content (the final dot after DATA,
or BDAT LAST with its chunk), in the words of the note on a break there ("no reply to the end
of data: the message may be delivered twice")."""

# How the log names each command whose reply is awaited (Postfix: "while sending MAIL FROM").
_NAMES: Final[dict[int, str]] = {
    _RSET: "RSET",
    _MAIL: "MAIL FROM",
    _RCPT: "RCPT TO",
    _DATA: "DATA",
    _CONTENT: END_OF_DATA,
}

# The positive replies each command may have (RFC 5321 4.2.1 and 4.3.2, RFC 3030 2 for BDAT):
# a 2xx says it was done, and DATA alone is answered 354, to ask for the content. Any other
# positive code is no answer to that command: a 250 to DATA was never sent the content, a 354 to
# the end of data did not take the message. The server and Pigeon no longer agree where the
# transaction stands, so nothing it said in it counts, and the connection ends (as Postfix does).
_GOES_ON: Final[dict[int, tuple[int, int, str]]] = {
    _RSET: (200, 299, "RSET"),
    _MAIL: (200, 299, "MAIL"),
    _RCPT: (200, 299, "RCPT"),
    _DATA: (354, 354, "DATA"),
    _CONTENT: (200, 299, "the end of data"),
}


class Transaction:
    """One MAIL...end-of-data exchange, sans-IO.

    `start()` gives the first bytes to send; every reply goes to `on_reply()`, which gives
    the next bytes (maybe none). `done` is True once every expected reply has arrived;
    `result()` then says what happened to each recipient.
    """

    def __init__(
        self,
        envelope: Envelope,
        peer: Capabilities,
        *,
        pipelining: bool = True,
        chunking: bool = True,
        reset_first: bool = False,
    ) -> None:
        self.envelope = envelope
        self.peer = peer
        self.pipelining = pipelining and "PIPELINING" in peer
        self.chunking = chunking and "CHUNKING" in peer
        self.reset_first = reset_first
        self._pending: list[tuple[int, int]] = []  # (what, recipient index)
        self._next_rcpt = 0
        self._rcpt_replies: list[Reply | None] = [None] * len(envelope.recipients)
        self._mail_reply: Reply | None = None
        self._data_reply: Reply | None = None
        self._bdat_not_understood: Reply | None = None
        self._ended = False  # the server answered the end of the content: its transaction is over
        self._closing: Reply | None = None
        self._closing_answered = ""  # the command `_closing` answered

    @property
    def done(self) -> bool:
        return not self._pending

    @property
    def ending(self) -> bool:
        """The end of the content (the final dot, or BDAT LAST) is sent and its reply is still
        to come. The server may be taking the message meanwhile, and RFC 5321 4.5.3.2.6 gives
        that 10 minutes where other replies get 5. With PIPELINING and CHUNKING that is from
        the start: the content went with MAIL, and a server may hold every reply until it took it."""
        return any(what == _CONTENT for what, _ in self._pending)

    @property
    def end_in_doubt(self) -> bool:
        """The end of the content went out, its reply has not come (`ending`), and the server
        may have taken the message meanwhile: if the connection ends now, a try again may
        deliver it twice. Not if what the server answered before rules it out: MAIL refused,
        or every recipient refused. Replies come in the order of their commands (RFC 2920
        3.1), so those came before any reply to the end, and a server with nobody to deliver
        to takes no message. (Nor after a 421 ahead of the end's reply: it ends the
        transaction, `on_reply`, with nothing left pending.)"""
        if not self.ending:
            return False
        mail = self._mail_reply
        if mail is not None and not mail.is_success:
            return False
        return any(reply is None or reply.is_success for reply in self._rcpt_replies)

    def unanswered(self) -> str | None:
        """The command whose reply comes next ("MAIL FROM", "RCPT TO", "DATA", `END_OF_DATA`,
        "RSET"), or None when none is awaited: what a timeout or a close cut. With PIPELINING
        several are sent at once, and replies come in their order (RFC 2920 3.1): the first
        not answered is the one the server stopped at."""
        pending = self._pending
        return _NAMES[pending[0][0]] if pending else None

    def start(self) -> bytes:
        out = []
        if self.reset_first:
            out.append(b"RSET\r\n")
            self._pending.append((_RSET, 0))
            if not self.pipelining:
                return b"RSET\r\n"  # MAIL goes after RSET's reply
        out.append(self._mail_command())
        self._pending.append((_MAIL, 0))
        if self.pipelining:
            while self._next_rcpt < len(self.envelope.recipients):
                out.append(self._send_rcpt())
            out.append(self._send_end())
        return b"".join(out)

    @property
    def closing(self) -> Reply | None:
        """The 421 that ended the transaction (RFC 5321 3.8: the server is closing the
        connection), or None. The connection must not carry another transaction."""
        return self._closing

    def on_reply(self, reply: Reply) -> bytes:
        """Take the next reply; return what to send next (maybe nothing). Raises
        ClientProtocolError for a reply to no command, or a positive one that its command
        cannot have (`_GOES_ON`): the transaction is then over, and nothing it said counts.
        A 421, to any command, ends it at once (`closing`)."""
        if not self._pending:
            raise ClientProtocolError(f"unexpected reply: {reply}")
        what, index = self._pending[0]
        if reply.code < 400:
            low, high, verb = _GOES_ON[what]
            if not low <= reply.code <= high:
                # Raised with the command still pending: a broken reply to the end of data
                # leaves it unanswered (the session says the message may have been taken).
                verb = "BDAT" if what == _CONTENT and self.chunking else verb
                expected = "354" if low == high else "2xx"
                raise ClientProtocolError(f"answered {verb} with {reply}, where only {expected} or an error may come")
        self._pending.pop(0)
        out = self._take(what, index, reply)
        if reply.code == 421:
            # RFC 5321 3.8: the server is going away, in answer to whatever command. Nothing
            # more is said, nor waited for: what has no answer of its own gets this one. It
            # is a definite no, even where the content went out ahead of it (PIPELINING with
            # CHUNKING: BDAT LAST rides with MAIL): replies come in order (RFC 2920 3.1), so
            # the server went away before it answered the end, and took no message there.
            self._closing = reply
            self._closing_answered = _NAMES[what]
            self._pending.clear()
            return b""
        return out

    def _take(self, what: int, index: int, reply: Reply) -> bytes:
        if what == _MAIL:
            self._mail_reply = reply
            # Refused, in a pipelined group the RCPT and DATA replies still come: they are read,
            # and count for nothing (`result`), but a 354 still gets its end of data.
            return b"" if self.pipelining or not reply.is_success else self._continue()
        if what == _RCPT:
            self._rcpt_replies[index] = rcpt_reply_read(reply)
            return b"" if self.pipelining else self._continue()
        if what == _DATA:
            if reply.code != 354:
                if self._mail_ok():
                    self._data_reply = reply
                return b""
            self._pending.append((_CONTENT, 0))
            if not (self._mail_ok() and self._accepted_any()):
                return b".\r\n"  # nobody to deliver to: end the empty data to stay in step
            return dot_stuff(self.envelope.body)
        if what == _CONTENT:
            if self._mail_ok() and self._accepted_any():
                self._data_reply = reply
                if self.chunking and reply.code in BDAT_NOT_UNDERSTOOD:
                    self._bdat_not_understood = reply
                    self._data_reply = bdat_not_understood(reply)
                # RFC 5321 4.1.1.4: whatever the reply to the end of data, the server has
                # cleared the transaction, so no RSET is needed. RFC 3030 says no such thing of
                # a refused BDAT: reset after one, to be sure.
                self._ended = reply.is_success or not self.chunking
            return b""
        if not self.pipelining:  # _RSET, in lock-step: MAIL goes now
            self._pending.append((_MAIL, 0))
            return self._mail_command()
        return b""  # _RSET when pipelining

    def result(self) -> Result:
        mail, closing = self._mail_reply, self._closing
        replies: list[Reply] = []
        for reply in self._rcpt_replies:
            if mail is not None and not mail.is_success:
                replies.append(mail)
            elif reply is None:
                replies.append(closing or Reply(451, "4.4.0", ("no reply to RCPT before the connection ended",)))
            elif not reply.is_success:
                replies.append(reply)
            elif self._data_reply is None:
                no_end = Reply(451, "4.4.0", ("no reply to the end of data before the connection ended",))
                replies.append(closing or no_end)
            else:
                replies.append(self._data_reply)
        return Result(
            replies,
            mail,
            self._data_reply,
            needs_reset=self._mail_ok() and not self._ended,
            bdat_not_understood=self._bdat_not_understood,
            closing=closing,
            closing_answered=self._closing_answered,
        )

    def settled(self) -> list[Reply | None]:
        """Each recipient's own outcome so far, for a transaction the connection's end cut
        short (a close, a timeout): the refusal of MAIL, or of its RCPT, when the server gave
        one; None where it has none yet, an accepted recipient included (the server may or may
        not have taken the message: the end of data was never answered). A refusal is final
        whatever follows: the server answered that recipient, and a 5xx is a bounce now, not a
        deferral until the message expires (as Postfix has it, and as after a 421, `result`)."""
        mail = self._mail_reply
        if mail is not None and not mail.is_success:
            return [mail] * len(self._rcpt_replies)
        return [reply if reply is not None and not reply.is_success else None for reply in self._rcpt_replies]

    # --- helpers -------------------------------------------------------------------------
    def _mail_ok(self) -> bool:
        return self._mail_reply is not None and self._mail_reply.is_success

    def _accepted_any(self) -> bool:
        return any(r is not None and r.is_success for r in self._rcpt_replies)

    def _continue(self) -> bytes:
        """Lock-step: the next RCPT, or the end of the envelope."""
        if self._next_rcpt < len(self.envelope.recipients):
            return self._send_rcpt()
        if not self._accepted_any():
            return b""  # every recipient refused: no data to send
        return self._send_end()

    def _send_rcpt(self) -> bytes:
        index = self._next_rcpt
        self._next_rcpt += 1
        self._pending.append((_RCPT, index))
        return self._rcpt_command(self.envelope.recipients[index])

    def _send_end(self) -> bytes:
        if self.chunking:
            # With BDAT the content goes with the command: one round trip (RFC 3030).
            self._pending.append((_CONTENT, 0))
            body = self.envelope.body
            return b"BDAT %d LAST\r\n" % len(body) + body
        self._pending.append((_DATA, 0))
        return b"DATA\r\n"

    def _mail_command(self) -> bytes:
        env, peer = self.envelope, self.peer
        params = []
        if peer.size is not None:
            params.append(f"SIZE={len(env.body)}")
        if env.eight_bit and "8BITMIME" in peer:
            params.append("BODY=8BITMIME")
        # Asked for, or UTF-8 in a header field, it goes on to a server that offers it
        # (RFC 6532 3: such a header is SMTPUTF8 mail; harmless, and the next hop knows the
        # sender's wish, for a DSN say); needed, it is offered or the message was refused.
        if env.wants_smtputf8 and "SMTPUTF8" in peer:
            params.append("SMTPUTF8")
        if "DSN" in peer:
            if env.ret:
                params.append(f"RET={env.ret}")
            if env.envid:
                params.append(f"ENVID={encode_xtext(env.envid)}")
        tail = (" " + " ".join(params)) if params else ""
        return f"MAIL FROM:<{with_a_label(env.sender)}>{tail}\r\n".encode()

    def _rcpt_command(self, recipient: Recipient) -> bytes:
        params = []
        if "DSN" in self.peer:
            if recipient.notify:
                params.append("NOTIFY=" + ",".join(recipient.notify))
            if recipient.orcpt:
                addr_type, _, address = recipient.orcpt.partition(";")
                if addr_type.lower() == "utf-8":
                    # RFC 6533 3.3: UTF-8 as it is (utf-8-addr-unitext) may only travel in an
                    # SMTPUTF8 transaction; with its non-ASCII characters as \x{HEX} (the
                    # utf-8-addr-xtext form), the same address can go to any server. It is
                    # kept as the client sent it (checked: no "+", "=", and each "\\" starts
                    # an escape), so its escapes stand: only what is not ASCII is escaped.
                    escaped = "".join(c if c.isascii() else f"\\x{{{ord(c):X}}}" for c in address)
                    params.append(f"ORCPT=utf-8;{escaped}")
                else:
                    params.append(f"ORCPT={addr_type};{encode_xtext(address)}")
        tail = (" " + " ".join(params)) if params else ""
        return f"RCPT TO:<{with_a_label(recipient.address)}>{tail}\r\n".encode()


def dot_stuff(body: bytes) -> bytes:
    """The DATA form of a message: leading dots doubled, CRLF-terminated, then "."."""
    if not body:
        return b".\r\n"
    if not body.endswith(b"\r\n"):
        body += b"\r\n"
    if body.startswith(b"."):
        body = b"." + body
    if find_line_dot(body, 0) >= 0:
        body = body.replace(b"\r\n.", b"\r\n..")
    return body + b".\r\n"
