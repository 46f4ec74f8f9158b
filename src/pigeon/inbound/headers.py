"""A message's header as an application reads it: fields as text, and the few it shows decoded.

`header_fields` gives every field as [name, value], the value as written (folded, any RFC 2047
encoded-words left alone), but as text: UTF-8 in a header (RFC 6532, common in mail from
SMTPUTF8 senders and from many mail clients anyway) reads as the characters it spells. A line
that is not UTF-8 (8-bit mail in another charset, against RFC 5322 but sent all the same) is
read in the charset the message's Content-Type declares, when Python knows it and it reads
ASCII as ASCII; else as Windows-1252, the charset such mail is most often in (else Latin-1,
which reads any byte): `caf\xe9` is "café", not "caf\ufffd". The raw message, which travels with
it, keeps the bytes as they came.

`decoded` gives Subject, From and To as a person reads them: unfolded, with the encoded-words
(`=?utf-8?q?Caf=C3=A9?=`, `=?iso-8859-1?b?...?=`) decoded. A value with a "B" encoded-word whose
text is not base64 at all is given as written: the email package would decode what it could
of it into garbage. Another one broken, or in an unknown charset, is kept or dropped as the
email package does; nothing here raises.

In an address field the encoded-words are decoded only where they may stand, in a display name
or a comment, and put back quoted as the text they decode to needs (a display name with `,` `<`
`@` `"`... as a quoted-string; in a comment, parentheses and backslashes escaped): the text read
with an address parser (`email.utils.getaddresses`, Ruby's Mail) gives the addresses of the
field as written. Decoded as plain text, `=?utf-8?q?=3Cceo=40company.test=3E=2C?= <a@evil.test>`
would read as two addresses, the first of them ceo@company.test.
"""

from __future__ import annotations

import codecs
import re
from email.headerregistry import HeaderRegistry, UnstructuredHeader
from email.parser import Parser
from email.policy import compat32
from email.utils import getaddresses
from typing import Final

_FIELD: Final = re.compile(r"[\x21-\x39\x3b-\x7e]+:")  # a field name (printable ASCII but ":") and its colon
_FOLD: Final = re.compile(r"\r\n|\r|\n")
# The charset parameter of the Content-Type field (folded or not) of a header block.
_CHARSET: Final = re.compile(
    rb'(?im)^content-type:(?:[^\r\n]|\r?\n[ \t])*?charset[ \t]*=[ \t]*"?([A-Za-z0-9!#$%&\'+\-.^_`{}~]+)'
)
_ASCII_PROBE: Final = bytes(range(0x20, 0x7F)) + b"\r\n\t"
# NUL and other controls have no place in a header's text, and PostgreSQL's text refuses NUL
# (a row refused for good): dropped from decoded values. Tabs are kept.
_CONTROL: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# Every field as unstructured text: an address header's own parser rewrites what it cannot
# parse ("<<<x" becomes "<>"), where the application wants the words that were there.
_TEXT: Final = HeaderRegistry(default_class=UnstructuredHeader, use_default_map=False)
_B_WORD: Final = re.compile(r"=\?[^?\s]+\?[bB]\?([^?]*)\?=")
_BASE64: Final = re.compile(r"[A-Za-z0-9+/=]*")  # (missing padding is forgiven, as everyone does)
DECODED: Final = ("subject", "from", "to")  # the fields `decoded` gives, by their JSON names
# Fields that hold addresses (RFC 5322 3.6.2, 3.6.3, 3.6.6, and common ones of the same form):
# their display names are decoded and quoted as the addresses need.
_ADDRESS_FIELDS: Final = frozenset(
    {"from", "sender", "reply-to", "to", "cc", "bcc", "resent-from", "resent-sender", "resent-to", "resent-cc",
     "resent-bcc", "mail-followup-to", "mail-reply-to", "disposition-notification-to", "errors-to"}
)  # fmt: skip
# An address field's lexical tokens as an address parser reads them (RFC 5322 3.2, the email
# package's _parseaddr): a quoted-string, a domain literal, a run of white space, a special,
# or an atom (anything up to the next special or white space). Comments, which nest, are read
# apart. An unterminated quoted-string or literal runs to the end, as those parsers read it.
_TOKEN: Final = re.compile(r'"(?:[^"\\]|\\.)*"?|\[(?:[^\]\\]|\\.)*\]?|[ \t]+|[<>,:;@.]|[^ \t"()<>,:;@.\[\]]+|.', re.S)
_QUOTED_PAIR: Final = re.compile(r"\\(.)", re.S)
# A display name that needs no quotes: atoms (no specials, no backslash) between single spaces.
_ATOMS: Final = re.compile(r'[^ \t"()<>,:;@.\[\]\\]+(?: [^ \t"()<>,:;@.\[\]\\]+)*')


def header_fields(block: bytes) -> list[list[str]]:
    """[name, value] for each field of a header block, as the email package's compat32
    parser gives them from the block read as text (`header_text`; a folded value keeps its
    line breaks)."""
    text = header_text(block)
    fields = _plain_fields(text)
    if fields is None:
        headers = Parser(policy=compat32).parsestr(text + "\r\n\r\n", headersonly=True)
        fields = [[name, str(value)] for name, value in headers.items()]
    return fields


def header_text(block: bytes) -> str:
    """A header block as text: UTF-8, but for the lines that are not, read in the declared
    charset, else Windows-1252, else Latin-1 (see the module's docstring)."""
    try:
        return block.decode("utf-8")
    except UnicodeDecodeError:
        pass
    fallback = _declared_charset(block)
    lines = []
    for line in block.split(b"\n"):  # line by line: a UTF-8 field stays UTF-8 beside a Latin-1 one
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            for charset in (fallback, "cp1252", "latin-1"):
                if charset is not None:
                    try:
                        lines.append(line.decode(charset))
                        break
                    except UnicodeDecodeError:
                        continue
    return "\n".join(lines)


def _declared_charset(block: bytes) -> str | None:
    """The charset the Content-Type field declares, when Python knows it and it reads ASCII as
    ASCII (not UTF-16, say); None otherwise, or when it is UTF-8 or ASCII (which did not read)."""
    match = _CHARSET.search(block)
    if match is None:
        return None
    name = match.group(1).decode("ascii")
    try:
        codec = codecs.lookup(name).name
    except LookupError:
        return None
    if codec in ("utf-8", "ascii"):
        return None
    try:
        ascii_as_ascii = _ASCII_PROBE.decode(codec) == _ASCII_PROBE.decode("ascii")
    except (UnicodeDecodeError, LookupError, TypeError, ValueError):
        return None
    return codec if ascii_as_ascii else None


def _plain_fields(text: str) -> list[list[str]] | None:
    """The fields of a plain header block (CRLF line ends, every line a field or a
    continuation) read directly, ten times faster than the email package; None for any
    other block, which that parser reads (and whose oddities it knows)."""
    if not text:
        return []
    lines = text.split("\r\n")
    if "\r" in text.replace("\r\n", "") or "\n" in text.replace("\r\n", ""):
        return None
    fields: list[list[str]] = []
    for line in lines:
        if line[:1] in (" ", "\t"):
            if not fields:
                return None
            fields[-1][1] += "\r\n" + line
        elif _FIELD.match(line):
            name, _, value = line.partition(":")
            fields.append([name, value.lstrip(" \t")])
        else:
            return None
    return fields


def decoded(fields: list[list[str]]) -> dict[str, str | None]:
    """Subject, From and To (the first of each) unfolded and decoded, by their lower-case
    names; None for a field the message does not have."""
    found: dict[str, str | None] = dict.fromkeys(DECODED)
    for name, value in fields:
        key = name.lower()
        if key in found and found[key] is None:
            found[key] = decode_value(name, value)
    return found


def broken_b_word(text: str) -> bool:
    """Whether `text` has a "B" encoded-word whose text holds a character base64 has not."""
    return any(_BASE64.fullmatch(word[1]) is None for word in _B_WORD.finditer(text))


def decode_value(name: str, value: str) -> str:
    """A field's value unfolded (RFC 5322 2.2.3) with its encoded-words decoded (RFC 2047);
    in an address field, only those of display names and comments, quoted as they need."""
    unfolded = _FOLD.sub("", value)
    if "=?" in unfolded and not broken_b_word(unfolded):
        text = _addresses(name, unfolded) if name.lower() in _ADDRESS_FIELDS else _text(name, unfolded)
    else:
        # Without an encoded-word the email package gives the value back as it is, at a
        # hundredth of the cost: its parse was most of an inbound message's CPU (150 us of
        # about 250 for a 5 KiB message handed to a log or Sidekiq target).
        text = unfolded
    return _CONTROL.sub("", text).strip()


def _text(name: str, text: str) -> str:
    """Unstructured text with its encoded-words decoded."""
    try:
        return str(_TEXT(name, text))
    except Exception:  # the email package's leniency has had bugs: the value as written, then
        return text


def _addresses(name: str, text: str) -> str:
    """An address field's text with the encoded-words of its display names and comments
    decoded, and quoted so that an address parser reads the same addresses in it as in the
    text as written (when it would not, whatever the reason, the text as written)."""
    out: list[str] = []
    pending: list[str] = []  # the tokens since the last special: a display name when "<" or ":" follows
    angle = False
    for token in _tokens(text):
        if angle:  # an address in angle brackets: as written
            out.append(token)
            angle = token != ">"
        elif token in ("<", ":"):
            out += _phrase(name, pending)
            out.append(token)
            pending = []
            angle = token == "<"
        elif token in (",", ";", ">"):
            out += [_comment(name, t) for t in pending]
            out.append(token)
            pending = []
        else:
            pending.append(token)
    out += [_comment(name, t) for t in pending]
    decoded = "".join(out)
    if [a for _, a in getaddresses([decoded])] != [a for _, a in getaddresses([text])]:
        return text
    return decoded


def _tokens(text: str) -> list[str]:
    """`text` as the tokens of `_TOKEN`, a comment (nested ones and all) as one."""
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos] == "(":
            depth, end = 0, pos
            while end < len(text):
                if text[end] == "\\":
                    end += 1
                elif text[end] == "(":
                    depth += 1
                elif text[end] == ")":
                    depth -= 1
                    if depth == 0:
                        break
                end += 1
            tokens.append(text[pos : end + 1])
            pos = end + 1
        else:
            match = _TOKEN.match(text, pos)
            assert match is not None  # (its last branch takes any character)
            tokens.append(match.group())
            pos = match.end()
    return tokens


def _phrase(name: str, tokens: list[str]) -> list[str]:
    """The tokens before a "<" or a group's ":": each run of words between comments, when it
    has an encoded-word, decoded (its quoted-strings unquoted) into one display name, quoted
    if it needs to be. A run with an "@", a domain literal or a stray ")" or "]" is no display
    name: as written."""
    out: list[str] = []
    run: list[str] = []
    for token in [*tokens, ""]:
        if token and token[0] != "(":
            run.append(token)
            continue
        words = "".join(run)
        if "=?" in words and not any(t in ("@", ")", "]") or t[0] == "[" for t in run):
            lead = len(words) - len(words.lstrip(" \t"))
            trail = len(words) - len(words.rstrip(" \t"))
            unquoted = "".join(_QUOTED_PAIR.sub(r"\1", t[1:-1] if t.endswith('"') and len(t) > 1 else t[1:])
                               if t[0] == '"' else t for t in run)  # fmt: skip
            display = _CONTROL.sub("", _text(name, unquoted)).strip()
            words = words[:lead] + _quoted(display) + words[len(words) - trail :]
        out.append(words)
        out.append(_comment(name, token))
        run = []
    return out


def _quoted(display: str) -> str:
    """A display name as a phrase: as it is when it is atoms, else a quoted-string."""
    if not display or (_ATOMS.fullmatch(display) and "=?" not in display):
        return display
    return '"' + display.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _comment(name: str, token: str) -> str:
    """A comment with the encoded-words of its text decoded, its parentheses and backslashes
    escaped; as written when it nests or escapes anything itself (or is no comment)."""
    inner = token[1:-1]
    if token[:1] != "(" or token[-1:] != ")" or "=?" not in inner or any(c in inner for c in "()\\"):
        return token
    text = _CONTROL.sub("", _text(name, inner))
    return "(" + re.sub(r"([()\\])", r"\\\1", text) + ")"
