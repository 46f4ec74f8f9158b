"""A lean MIME writer for the messages Pigeon builds (injection from parts, per recipient).

Python's `email` package builds a tree of objects and re-parses every header it is given;
for one message that is fine, for a 100-recipient request it was most of the cost (about
1.5 ms per recipient). The structures needed here are few and fixed, so this writes them
directly: 7bit where the text allows it, quoted-printable otherwise, base64 for attachments,
RFC 2047 encoded words for non-ASCII header text (in an address field, for the display
name only: the address stays an addr-spec), CRLF throughout. No line is longer than the
`max_line` it is given (the node's `[smtp] max_line_length`, which SMTP reception checks
every message against, a composed one too), where what it writes can be folded at all.

    multipart/mixed                  (only with attachments)
      multipart/related              (only with inline parts and HTML)
        multipart/alternative        (only with both text and HTML)
          text/plain
          text/html
        inline parts
      attachments
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import re
import secrets
import urllib.parse
from dataclasses import dataclass
from typing import Final

from pigeon.smtp import address

MAX_LINE: Final = 998
"""The longest line RFC 5322 2.1.1 allows, without its CRLF: the default `max_line`."""
# A media type as RFC 2045 5.1 writes one: type/subtype, then parameters `; name=value`, a
# value a token or a quoted-string. Read alike by Python and JSON Schema (ECMA-262): the
# request's schema validates with it, and the OpenAPI document shows it.
_TOKEN: Final = r"[!#$%&'*+.0-9A-Z^_`a-z{|}~-]+"  # no space, control or tspecial ()<>@,;:\"/[]?=
_QUOTED: Final = r'"(?:[\t\x20\x21\x23-\x5b\x5d-\x7e]|\\[\t\x20-\x7e])*"'
MEDIA_TYPE: Final = rf"^{_TOKEN}/{_TOKEN}(?:[ \t]*;[ \t]*{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))*[ \t]*$"
MEDIA_TYPE_TEXT: Final = (
    'Not a media type: type/subtype, then any parameters as "; name=value", a value with a space or'
    ' any of ()<>@,;:\\"/[]?= in double quotes (RFC 2045 5.1), e.g. "text/plain; charset=utf-8"'
)
"""What is said of a value that is not a `MEDIA_TYPE`."""
_MEDIA_TYPE: Final = re.compile(MEDIA_TYPE)
_TYPE: Final = re.compile(rf"[ \t]*({_TOKEN}/{_TOKEN})")
_PARAMETER: Final = re.compile(rf"[ \t]*;[ \t]*({_TOKEN})=({_TOKEN}|{_QUOTED})")
_FOLD_AT: Final = 76
# What RFC 5322 allows in an unstructured header as it is: printable ASCII and spaces.
_PLAIN: Final = re.compile(r"[\x20-\x7e]*")
_PLAIN_TEXT: Final = re.compile(r"[\x20-\x7e\t\n]*")


@dataclass(frozen=True, slots=True)
class Part:
    """A finished MIME part: its header lines and encoded body, CRLF-terminated."""

    headers: bytes
    body: bytes

    def to_bytes(self) -> bytes:
        return self.headers + b"\r\n" + self.body


def text_part(text: str, subtype: str, max_line: int = MAX_LINE) -> Part:
    """text/<subtype> in UTF-8: 7bit when it is printable ASCII in lines of at most `max_line`,
    else quoted-printable (control characters as they are are read back differently by mail
    readers; a longer line would be refused by the content check)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if _PLAIN_TEXT.fullmatch(text) and all(len(line) <= max_line for line in text.split("\n")):
        body, encoding = text.encode("ascii"), "7bit"
    else:
        # Quoted-printable of the UTF-8 bytes; soft line breaks keep lines within 76 columns.
        body, encoding = binascii.b2a_qp(text.encode("utf-8", "surrogatepass"), istext=True), "quoted-printable"
    body = body.replace(b"\n", b"\r\n")
    if not body.endswith(b"\r\n"):
        body += b"\r\n"
    headers = f'Content-Type: text/{subtype}; charset="utf-8"\r\nContent-Transfer-Encoding: {encoding}\r\n'
    return Part(headers.encode(), body)


def media_type(value: str) -> tuple[str, list[tuple[str, str]]]:
    """A `MEDIA_TYPE`'s type/subtype and its parameters (name, value as written: a token or a
    quoted-string). Raises ValueError for what is not one."""
    found = _TYPE.match(value)
    if found is None or _MEDIA_TYPE.fullmatch(value) is None:
        raise ValueError(MEDIA_TYPE_TEXT)
    return found.group(1), [(m.group(1), m.group(2)) for m in _PARAMETER.finditer(value, found.end())]


def binary_part(
    data: bytes, content_type: str, *, file_name: str | None, content_id: str | None, max_line: int = MAX_LINE
) -> Part:
    """An attachment (or, with a content id, an inline part), base64 in 76-column lines.
    `content_type`: a `MEDIA_TYPE`; its parameters are kept, and `name` is written from
    `file_name` (the caller makes sure the type names none then).

    The type and each parameter, and the content id, cannot be folded: `max_line` must leave
    room for each on a line of its own (`compose.check_request` says so)."""
    kind, parameters = media_type(content_type)
    items = [f"{name}={value}" for name, value in parameters]
    field = [f"Content-Type: {kind}"]
    for item in items:  # folded between parameters (RFC 2045 5.1 allows white space there)
        if len(field[-1]) + 2 + len(item) > _FOLD_AT:
            field[-1] += ";"
            field.append(f" {item}")
        else:
            field[-1] += f"; {item}"
    if file_name:
        field[-1] = _with_file_name(field[-1], "name", file_name, max_line)
    lines = ["\r\n".join(field)]
    disposition = "inline" if content_id else "attachment"
    lines.append(f"Content-Disposition: {disposition}")
    if file_name:
        lines[-1] = _with_file_name(lines[-1], "filename", file_name, max_line)
    if content_id:
        lines.append(token_field("Content-ID", f"<{content_id}>", max_line).removesuffix("\r\n"))
    lines.append("Content-Transfer-Encoding: base64")
    body = base64.encodebytes(data).replace(b"\n", b"\r\n")
    return Part(("\r\n".join(lines) + "\r\n").encode("utf-8"), body)


def multipart(subtype: str, parts: list[Part], *, root_type: str | None = None) -> Part:
    """multipart/<subtype> of `parts`. `root_type`: the `type` parameter multipart/related
    must have (RFC 2387 3.1), the media type of its first part.

    Each part keeps its last line break: the CRLF before a boundary delimiter belongs to the
    delimiter (RFC 2046 5.1.1), so another is written after the part's own (without it a text
    that ends with a line break lost it, as a single-part message does not)."""
    boundary = f"=_pigeon_{secrets.token_hex(12)}"
    body = b"".join(b"--" + boundary.encode() + b"\r\n" + part.to_bytes() + b"\r\n" for part in parts)
    body += b"--" + boundary.encode() + b"--\r\n"
    field = f"Content-Type: multipart/{subtype}"
    if root_type is not None:
        field = _with_parameter(field, "type", root_type, MAX_LINE)
    # Folded before the boundary when the line would pass 76 columns (alternative's does):
    # 81 octets, over the 78 a node may hold lines to.
    field = _with_parameter(field, "boundary", boundary, MAX_LINE)
    return Part(f"{field}\r\n".encode(), body)


# What reads as the end of a line (`str.splitlines`: CR, LF, VT, FF, FS, GS, RS, NEL, LS, PS):
# each becomes a space, so that no line break can be smuggled into a header. Nothing else of
# the text is touched: U+3000, U+00A0, a tab or two spaces are the text's own.
_LINE_BREAK: Final = re.compile("\r\n|[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
_WSP: Final = re.compile(r"[ \t]+")


def one_line(value: str) -> str:
    """`value` with each line break (`_LINE_BREAK`) made a space, and nothing else changed."""
    return _LINE_BREAK.sub(" ", value)


def header(name: str, value: str) -> str:
    """`Name: value` with CRLF, for an unstructured field (Subject, Comments, an optional field
    such as `X-...`, RFC 5322 3.6.5 and 3.6.8): the text as it is, folded before white space,
    when it is printable ASCII whose words fit a line; else RFC 2047 words (RFC 2047 5(1)).

    The text is kept as given but for its line breaks: its spaces, tabs, runs of them, and
    white space beyond ASCII (U+3000, U+00A0). Folding only inserts CRLF before white space
    that is there, so unfolding gives the text back. White space at either end would be
    trimmed by readers (and by relaxed DKIM canonicalization): such a value is encoded, the
    white space inside the words."""
    value = one_line(value)
    # Text with "=?" in it could read back as an encoded word (RFC 2047) and be decoded into
    # something else: it is encoded itself, as any other text that is not plain.
    plain = _PLAIN_FIELD.fullmatch(value) is not None and "=?" not in value and value == value.strip(" \t")
    if plain and value:
        words = _WSP.split(value)
        # Folding only happens before white space: a word that cannot fit on a line of its own
        # (or the first, beside the name) would start the value with a fold, read as a space.
        if len(name) + 2 + len(words[0]) <= _FOLD_AT and max(map(len, words)) < _FOLD_AT:
            return _fold_text(f"{name}: ", value)
    if not value:
        return f"{name}: \r\n"
    words = _encoded_words(value, _FOLD_AT - len(name) - 2)
    if len(name) + 2 + len(words[0]) > _FOLD_AT:  # a long name leaves no room for one character's word
        return _fold_onto([f"{name}:"], _encoded_words(value, _MAX_WORD))
    return _folded(name, words)


_PLAIN_FIELD: Final = re.compile(r"[\x20-\x7e\t]*")


def _fold_text(start: str, value: str) -> str:
    """`start` and `value` (printable ASCII, no white space at either end), folded with CRLF
    before a run of white space where the line would pass 76 columns: nothing added or lost."""
    lines = [start]
    for gap, word in re.findall(r"([ \t]*)([^ \t]+)", value):
        if gap and len(lines[-1]) + len(gap) + len(word) > _FOLD_AT:
            lines.append(gap + word)
        else:
            lines[-1] += gap + word
    return "\r\n".join(lines) + "\r\n"


def token_field(name: str, value: str, max_line: int = MAX_LINE) -> str:
    """`Name: value` with CRLF, for a value that is one token and cannot be folded (a msg-id,
    a tenant): beside the name, or on a line of its own after it when beside it the line
    would be longer than `max_line` octets (FWS may come first in such a field, RFC 5322
    3.6.4; readers of a routing header unfold and trim it)."""
    if len(name) + 2 + len(value.encode("utf-8", "surrogatepass")) <= max_line:
        return f"{name}: {value}\r\n"
    return f"{name}:\r\n {value}\r\n"


_FIELD_WHITE_SPACE: Final = re.compile(r"[ \t\r\n]+")


def plain_field(name: str, value: str, max_line: int = MAX_LINE) -> str:
    """`Name: value` with CRLF, the text as it is, never RFC 2047 words: for a field whose
    reader takes its text undecoded (a routing header, which names a queue). Folded between
    words before 76 octets where they allow, beside the name or on a line of its own after it
    as `token_field` puts one word; line breaks in it are unfolded (none can be smuggled in).
    Split at SP, HTAB and line breaks only, a header's own white space: not `str.split()`,
    which takes VT, FF, U+0085 or U+2028 for white space too, so that the intake read
    "ac<VT>me" as "ac me" (queue "ac_me") where SMTP refuses the control character."""
    stripped = value.strip(" \t\r\n")
    words = _FIELD_WHITE_SPACE.split(stripped) if stripped else []
    if not words:
        return f"{name}: \r\n"
    return _fold_onto(token_field(name, words[0], max_line).removesuffix("\r\n").split("\r\n"), words[1:])


_SHORT_ID: Final = 22  # hex characters: 88 random bits, no less unique than make_msgid's
SHORT_MESSAGE_ID_FRAME: Final = len(" <@>") + _SHORT_ID
"""The octets of `message_id_field`'s line beside the host name when folded: `max_line` must
allow for them (`pigeon.config.load` checks `[smtp] hostname` against `max_line_length`)."""


def message_id_field(hostname: str, max_line: int = MAX_LINE) -> str:
    """A Message-ID field of Pigeon's, `<22 random hex characters@hostname>`, with CRLF, within
    `max_line`: folded before the msg-id when need be. Not `email.utils.make_msgid`'s, whose
    38 characters before the host name (the time, the worker's pid) took a line past a lowered
    `max_line` and told every reader the pid."""
    return token_field("Message-ID", f"<{secrets.token_hex(_SHORT_ID // 2)}@{hostname}>", max_line)


def address_header(name: str, display_name: str, addr: str, max_line: int = MAX_LINE) -> str:
    """`Name: display-name <addr-spec>` with CRLF, for From, To and Reply-To (RFC 5322 3.4).

    Only the display name is ever encoded: an encoded word is a phrase, never an address
    (RFC 2047 5), and a whole field made one word has no address a reader, a DKIM signer or
    the next hop can find. The name goes as atoms, a quoted string or, when it is not printable
    ASCII, RFC 2047 words of at most 75 characters. The field is folded between words (in a
    quoted string too: FWS is allowed there, RFC 5322 3.2.4) before 76 columns where a word
    allows it; the line of the address is at most 257 octets (` <addr-spec>`, RFC 5321
    4.5.3.1.3), and no other is over `max_line` (an ASCII word of the name longer than 76
    columns keeps a line of its own, up to that; one longer still is encoded). The address
    cannot be folded: `max_line` must leave room for ` <address>` (`compose.check_request`
    says so), and the address goes on a line of its own when beside the name it would not fit.

    The domain goes as its A-label when the local part is ASCII (`address.with_a_label`, as
    MAIL and RCPT go on the wire), so the field is ASCII and the message needs no SMTPUTF8
    for it; a local part that is not ASCII has no such form, and is
    written in UTF-8 as RFC 6532 allows (the caller marks the message as needing SMTPUTF8)."""
    addr = address.with_a_label(addr)
    display_name = one_line(display_name)  # no line breaks can be smuggled in
    if not display_name.strip():
        # A bare addr-spec is the plainest mailbox; a UTF-8 one in angle brackets, which
        # readers of RFC 6532 mail parse more reliably.
        return token_field(name, addr if addr.isascii() else f"<{addr}>", max_line)
    return _folded(name, [*_phrase(display_name, len(name) + 2, max_line), f"<{addr}>"])


# RFC 5322 3.2.3 atext: a display name made of these needs no quotes.
_ATOM: Final = re.compile(r"[A-Za-z0-9!#$%&'*+\-/=?^_`{|}~]+")
# What an RFC 2047 word in a phrase may hold as it is, in the Q encoding (RFC 2047 5(3));
# the space is written "_".
_Q_SAFE: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!*+-/")
_MAX_WORD: Final = 75  # RFC 2047 2: an encoded word is at most 75 characters
_WORD_FRAME: Final = len("=?utf-8?q??=")


def _phrase(display_name: str, first_column: int, max_line: int) -> list[str]:
    """The display name as the words of a phrase, for `_folded` to put on lines: printable
    ASCII as it is (quoted if it must be), anything else (or a word too long for any line)
    RFC 2047 words."""
    if _PLAIN.fullmatch(display_name) and "=?" not in display_name:  # "=?": not to be read as an encoded word
        words = display_name.split(" ")
        if not all(_ATOM.fullmatch(word) for word in words):
            quoted = '"' + display_name.replace("\\", "\\\\").replace('"', '\\"') + '"'
            words = quoted.split(" ")  # an escape is never a space: no quoted-pair is split
        # A word too long for 76 columns keeps a line of its own, longer: RFC 5322 2.1.1 asks
        # for 78 (SHOULD) and requires 998, and an ASCII name is best read as it is, up to the
        # node's own limit (past it, the content check would refuse the message).
        if first_column + len(words[0]) <= max_line and all(1 + len(word) <= max_line for word in words):
            return words
    return _encoded_words(display_name, _FOLD_AT - first_column)


def _encoded_words(text: str, first_room: int) -> list[str]:
    """`text` as RFC 2047 words in UTF-8, each at most 75 characters and the first at most
    `first_room`, never splitting a character.

    Readers drop the white space between two encoded words (RFC 2047 6.2), so the text's own
    spaces are inside them. Some do not (Python's `email.headerregistry` reads a phrase so),
    and see a space at every boundary: a word is ended after a space of the text where one
    leaves it room enough, so that what they see is at worst a doubled space, not a name cut
    in two."""
    words: list[str] = []
    chunk: list[bytes] = []  # the characters of the word being made, as UTF-8
    q = octets_in = 0  # its Q-encoded length and its octets, kept as it grows: no rescans
    room = min(first_room, _MAX_WORD)
    for char in text:
        octets = char.encode("utf-8")
        cost = _q_cost(octets)
        if chunk and _WORD_FRAME + min(q + cost, _b_length(octets_in + len(octets))) > room:
            spaces = [index for index, char_octets in enumerate(chunk) if char_octets == b" "]
            cut = spaces[-1] + 1 if spaces else len(chunk)
            rest = chunk[cut:]
            rest_q, rest_octets = sum(map(_q_cost, rest)), sum(map(len, rest))
            if _WORD_FRAME + min(rest_q + cost, _b_length(rest_octets + len(octets))) > _MAX_WORD:
                cut, rest, rest_q, rest_octets = len(chunk), [], 0, 0
            words.append(_encoded_word(b"".join(chunk[:cut]), q - rest_q, room))
            chunk, q, octets_in, room = rest, rest_q, rest_octets, _MAX_WORD
        chunk.append(octets)
        q += cost
        octets_in += len(octets)
    if chunk:
        words.append(_encoded_word(b"".join(chunk), q, room))
    return words


def _q_cost(octets: bytes) -> int:
    return sum(1 if octet in _Q_SAFE or octet == 0x20 else 3 for octet in octets)


def _b_length(octets: int) -> int:
    return -(-octets // 3) * 4


def _encoded_word(octets: bytes, q: int, room: int) -> str:
    """Q (which a person can read) unless B is shorter by more than a quarter or Q does not
    fit the room. `q`: the Q-encoded length of `octets`."""
    if _WORD_FRAME + q <= room and 4 * q <= 5 * _b_length(len(octets)):
        encoded = "".join("_" if o == 0x20 else chr(o) if o in _Q_SAFE else f"={o:02X}" for o in octets)
        return f"=?utf-8?q?{encoded}?="
    return f"=?utf-8?b?{base64.b64encode(octets).decode('ascii')}?="


def _folded(name: str, words: list[str]) -> str:
    """`Name: ` and the words, one space between them, folded before a word that would take
    its line past 76 octets (never before the first: it stays beside the name). In octets:
    an address in UTF-8 (RFC 6532) is longer so than in characters."""
    return _fold_onto([f"{name}: {words[0]}"], words[1:])


def _fold_onto(lines: list[str], words: list[str]) -> str:
    """`lines` (a field's, without CRLF) with `words` after them, one space between, folded
    before a word that would take its line past 76 octets; the field with its CRLF."""
    for word in words:
        if len(lines[-1].encode()) + 1 + len(word.encode()) > _FOLD_AT:
            lines.append(f" {word}")
        else:
            lines[-1] += f" {word}"
    return "\r\n".join(lines) + "\r\n"


def _with_parameter(field: str, name: str, value: str, max_line: int) -> str:
    """`field` (one line, without CRLF) with `; name="value"` added, for a value of Pigeon's
    own (a boundary, a media type: short printable ASCII): beside it when that line stays
    within 76 columns, else on a line of its own (folding between parameters, as RFC 2045
    allows). A file name, which may be anything, goes through `_with_file_name`."""
    quoted = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if len(field) + 2 + len(name) + 1 + len(quoted) <= min(_FOLD_AT, max_line):
        return f"{field}; {name}={quoted}"
    return f"{field};\r\n {name}={quoted}"


# RFC 2231 7 attribute-char: a token's characters but "*", "'" and "%"; the rest of a value
# is percent-encoded.
_ATTRIBUTE_SAFE: Final = "!#$&+^`{|}"  # (with letters, digits and "_.-~", which `quote` keeps)
_QUOTABLE_NAME: Final = re.compile(r"[\x20-\x7e]*")


def _with_file_name(field: str, name: str, value: str, max_line: int) -> str:
    """`field` (one line, without CRLF) with a file name parameter: `; name="value"` when the
    value is printable ASCII that fits a line of 76 columns and cannot be read as an RFC 2047
    word; else in RFC 2231's form, `name*=utf-8''<percent-encoded UTF-8>`, continued over
    `name*0*=`, `name*1*=`... lines within 76 columns as need be (never splitting a character).

    Never an encoded word in the quotes: RFC 2047 5 forbids them there, and strict readers
    show them raw; a name that looks like one (`=?utf-8?b?ZXZpbC5leGU=?=`) goes in RFC 2231's
    form too, so no reader decodes it into another. No ASCII `name=` beside the RFC 2231 one:
    a reader takes one of the two (Python's email the plain one, or the first, with a
    "duplicate parameter" defect), so a fallback would be what many read instead of the name."""
    if _QUOTABLE_NAME.fullmatch(value) and "=?" not in value:
        quoted = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if len(field) + 2 + len(name) + 1 + len(quoted) <= _FOLD_AT:
            return f"{field}; {name}={quoted}"
        if 1 + len(name) + 1 + len(quoted) <= _FOLD_AT:
            return f"{field};\r\n {name}={quoted}"
    encoded = [urllib.parse.quote(char, safe=_ATTRIBUTE_SAFE) for char in value]
    whole = f"{name}*=utf-8''" + "".join(encoded)
    if len(field) + 2 + len(whole) <= _FOLD_AT:
        return f"{field}; {whole}"
    if 1 + len(whole) <= _FOLD_AT:
        return f"{field};\r\n {whole}"
    room = min(_FOLD_AT, max_line) - 1  # each section on a line of its own, a ";" after it
    sections, empty = [f" {name}*0*=utf-8''"], True
    for char in encoded:
        if len(sections[-1]) + len(char) > room and not empty:
            sections.append(f" {name}*{len(sections)}*=")
        sections[-1] += char
        empty = False
    return f"{field};\r\n" + ";\r\n".join(sections)


# --- structured fields given by a request (`content.headers`) ---------------------------------
ADDRESS_FIELDS: Final = frozenset(
    {
        "from", "to", "cc", "bcc", "sender", "reply-to",
        "resent-from", "resent-to", "resent-cc", "resent-bcc", "resent-sender",
        "disposition-notification-to", "return-receipt-to", "errors-to", "mail-followup-to", "mail-reply-to",
    }
)  # fmt: skip
"""Fields whose value is an address list (RFC 5322 3.6.2, 3.6.3, 3.6.6; RFC 8098 2.1)."""
_ONE_MAILBOX: Final = frozenset({"sender", "resent-sender"})  # one mailbox, not a list (RFC 5322 3.6.2)
ID_FIELDS: Final = frozenset({"message-id", "in-reply-to", "references", "resent-message-id"})
"""Fields of msg-ids (RFC 5322 3.6.4, 3.6.6)."""
URL_FIELDS: Final = frozenset(
    {
        "list-unsubscribe",
        "list-unsubscribe-post",
        "list-help",
        "list-post",
        "list-subscribe",
        "list-owner",
        "list-archive",
    }
)
"""Fields of URLs in angle brackets (RFC 2369, RFC 8058)."""
_PRINTABLE: Final = re.compile(r"[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*")
_LIST_ID: Final = re.compile(r"(.*?)[ \t]*<([\x21-\x3b\x3d\x3f-\x7e]+)>")


def field(name: str, value: str, max_line: int = MAX_LINE) -> str:
    """`Name: value` with CRLF, for a field a request gives by name: an unstructured one as
    `header` writes it, a structured one never made an encoded word whole (RFC 2047 5: none in
    an addr-spec, a msg-id or a URL, where no reader decodes one). An address list is read and
    written again mailbox by mailbox, each display name encoded where it must be (as
    `address_header`); msg-ids and URLs must be ASCII, folded at their white space (a URL
    list after its commas too), a token longer than a line on a line of its own, up to
    `max_line`; a List-Id's phrase is encoded as a display name, its `<list-id>` kept.
    ValueError saying why for a value that cannot be written so."""
    lowered = name.lower()
    value = one_line(value)
    if lowered in ADDRESS_FIELDS:
        return _address_list(name, value, max_line)
    if lowered in ID_FIELDS or lowered in URL_FIELDS:
        value = value.strip(" \t")
        if not _PRINTABLE.fullmatch(value):
            what = "msg-ids" if lowered in ID_FIELDS else "URLs (write one that is not ASCII percent-encoded)"
            raise ValueError(
                f"must be printable ASCII: a field of {what} is never RFC 2047-encoded (RFC 2047 5), where"
                " a reader would not find them"
            )
        # RFC 2369 2: a reader takes the URLs in angle brackets and ignores a field without one
        # (List-Post's "NO" aside): one-click unsubscribe would silently not work.
        bare = lowered in URL_FIELDS and lowered != "list-unsubscribe-post" and "<" not in value
        if bare and not (lowered == "list-post" and value.upper().startswith("NO")):
            raise ValueError("must be URLs in angle brackets (<https://...>, <mailto:...>), as RFC 2369 2 has them")
        # A URL list folds after the comma between two URLs, never inside one's angle brackets,
        # where a comma is the URL's own (`?a=1,2`, `mailto:a@x,b@x`).
        split = r"[ \t]+" if lowered in ID_FIELDS else r"[ \t]+|(?<=>,)(?=[^ \t])"
        return _tokens(name, re.split(split, value), max_line)
    if lowered == "list-id":
        found = _LIST_ID.fullmatch(value.strip(" \t"))
        if found is None:
            raise ValueError('must be a list-id in angle brackets, after an optional phrase: "Name <list.example.org>"')
        phrase, list_id = found.groups()
        phrase = email.utils.unquote(phrase) if phrase.startswith('"') else phrase
        words = _phrase(phrase, len(name) + 2, max_line) if phrase.strip() else []
        return _checked(
            _folded(name, [*words, f"<{list_id}>"]) if words else token_field(name, f"<{list_id}>"), max_line
        )
    return text_field(name, value, max_line)


def text_field(name: str, value: str, max_line: int = MAX_LINE) -> str:
    """`Name: value` with CRLF, for an unstructured field a request gives by name (`X-...`,
    `Comments`): printable ASCII as it is, so that a machine that reads it (a tracking or
    feedback id) finds its text undecoded; anything else as `header` writes it (RFC 2047 words).

    White space at either end is dropped (readers trim it, as relaxed DKIM canonicalization
    does); the text's own spaces and tabs are kept, folded before white space where a line
    would pass 76 octets, and a word longer than that goes on a line of its own (the first
    too, as `token_field` puts it, when it would pass `max_line` beside the name). A word no line
    of `max_line` holds is written as `header` writes it, in RFC 2047 words, which fold anywhere:
    taken and read back whole, as a lowered `[smtp] max_line_length` has always taken it."""
    stripped = value.strip(" \t")
    # Text with "=?" could read back as an encoded word (RFC 2047 6.1) and be decoded into
    # something else: `header` encodes it, as any text that is not printable ASCII.
    if not _PLAIN_FIELD.fullmatch(stripped) or "=?" in stripped:
        return header(name, value)
    if not stripped:
        return f"{name}: \r\n"
    (_, first), *rest = re.findall(r"([ \t]*)([^ \t]+)", stripped)
    lines = token_field(name, first, max_line).removesuffix("\r\n").split("\r\n")
    for gap, word in rest:
        if len(lines[-1]) + len(gap) + len(word) > _FOLD_AT:
            lines.append(gap + word)
        else:
            lines[-1] += gap + word
    if max(len(line) for line in lines) > max_line:
        return header(name, value)
    return "\r\n".join(lines) + "\r\n"


_MAILBOX_LISTS: Final = frozenset({"from", "sender", "resent-from", "resent-sender", "disposition-notification-to"})
"""Address fields that list mailboxes only, no group (RFC 5322 3.6.2, 3.6.6; RFC 8098 2.1)."""


def _address_list(name: str, value: str, max_line: int) -> str:
    """An address list read and written again: each mailbox as `address_header` writes one,
    each group (RFC 5322 3.4, `undisclosed-recipients:;`, `Team: a@example.com, b@example.com;`)
    as its name, a colon, its mailboxes and a semicolon, so that a reader finds the group still."""
    items = _address_items(value)
    if not items or not value.strip(" \t"):
        raise ValueError("must be one or more addresses")
    lowered = name.lower()
    if lowered in _MAILBOX_LISTS and (group := next((i for i in items if i[0] is not None), None)) is not None:
        raise ValueError(
            f"must be mailboxes, not a group ({group[0]!r}): a group (Name: a@example.com;) goes in an address"
            " list, such as To or Cc (RFC 5322 3.6.2)"
        )
    mailboxes = [mailbox for _, members in items for mailbox in members]
    if lowered in _ONE_MAILBOX and len(mailboxes) > 1:
        raise ValueError(f"must be one address, not {len(mailboxes)} (RFC 5322 3.6.2)")
    words: list[str] = []
    count = 0
    for place, (group_name, members) in enumerate(items):
        if group_name is not None:
            column = len(name) + 2 if not words else 1
            words += _phrase(group_name, column, max_line)
            words[-1] += ":"
        for index, (display_name, addr) in enumerate(members):
            count += 1
            if not addr or (problem := address.check(addr)) is not None:
                raise ValueError(f"address {count} ({addr!r}): {problem.text if addr and problem else 'none found'}")
            addr = address.with_a_label(addr)
            column = len(name) + 2 if not words else 1
            if display_name.strip():
                words += [*_phrase(display_name, column, max_line), f"<{addr}>"]
            else:
                words.append(addr if addr.isascii() else f"<{addr}>")
            if index < len(members) - 1:
                words[-1] += ","
        if group_name is not None:
            words[-1] += ";"
        if place < len(items) - 1:
            words[-1] += ","
    return _tokens(name, words, max_line)  # (a display name's words and an address fold alike)


def _address_items(value: str) -> list[tuple[str | None, list[tuple[str, str]]]]:
    """The items of an address list, in order: (None, the mailboxes of a run of them), or (a
    group's display name, its mailboxes, maybe none). A group is a phrase, ":" outside quotes,
    comments, angle brackets and domain literals, then mailboxes up to ";" (RFC 5322 3.4).
    ValueError for a group left open or one within another."""
    items: list[tuple[str | None, list[tuple[str, str]]]] = []
    group: str | None = None  # the display name of the group being read
    start = 0
    quoted = escaped = False
    depth = 0  # of comments
    closer = ""  # ">" inside an angle-addr, "]" inside a domain literal

    def run(text: str) -> list[tuple[str, str]]:
        text = text.strip(" \t,")
        return email.utils.getaddresses([text]) if text else []

    for at, char in enumerate(value):
        if escaped:
            escaped = False
        elif char == "\\" and (quoted or depth):
            escaped = True
        elif quoted:
            quoted = char != '"'
        elif char == "(":
            depth += 1
        elif depth:
            depth -= char == ")"
        elif closer:
            closer = "" if char == closer else closer
        elif char == '"':
            quoted = True
        elif char in "<[":
            closer = ">" if char == "<" else "]"
        elif char == ":":
            if group is not None:
                raise ValueError(f"group {group!r} holds another group: a group's members are mailboxes (RFC 5322 3.4)")
            before, _, phrase = value[start:at].rpartition(",")
            if mailboxes := run(before):
                items.append((None, mailboxes))
            (phrase_name, _), *_ = email.utils.getaddresses([f"{phrase} <x@x>"]) or [("", "")]
            group, start = phrase_name.strip() or phrase.strip(), at + 1
            if not group or any(char in group for char in "@<>"):  # ("a@example.com Team:;": a comma left out)
                raise ValueError(
                    f"a group needs a name before its colon, not {group!r} (RFC 5322 3.4: Team: a@example.com;):"
                    " separate addresses with commas"
                )
        elif char == ";" and group is not None:
            items.append((group, run(value[start:at])))
            group, start = None, at + 1
    if group is not None:
        raise ValueError(f'group {group!r} is not closed: end it with ";" (RFC 5322 3.4: {group}: a@example.com;)')
    if (mailboxes := run(value[start:])) or not items:
        items.append((None, mailboxes))
    return [item for item in items if item[0] is not None or item[1]]


def _tokens(name: str, tokens: list[str], max_line: int) -> str:
    """Tokens that cannot be folded inside (msg-ids, URLs): one space between, folded before
    one that would take its line past 76 columns (the first on a line of its own after the
    name when beside it the line would pass `max_line`)."""
    first, *rest = tokens
    return _checked(_fold_onto(token_field(name, first, max_line).removesuffix("\r\n").split("\r\n"), rest), max_line)


def _checked(field: str, max_line: int) -> str:
    longest = max(len(line.encode("utf-8", "surrogatepass")) for line in field.split("\r\n"))
    if longest > max_line:
        raise ValueError(
            f"holds a word of {longest} octets on its line, which cannot be folded: over [smtp] max_line_length"
            f" ({max_line}), which the message would be refused for"
        )
    return field


def is_utf8(data: bytes) -> bool:
    """Whether `data` is UTF-8 (ASCII is)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
