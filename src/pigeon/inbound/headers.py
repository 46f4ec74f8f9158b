"""A message's header as an application reads it: fields as text, and the few it shows decoded.

`header_fields` gives every field as [name, value], the value as written (folded, any RFC 2047
encoded-words left alone), but as text: UTF-8 in a header (RFC 6532, common in mail from
SMTPUTF8 senders and from many mail clients anyway) reads as the characters it spells; bytes
that are not UTF-8 (8-bit mail in another charset) show as U+FFFD, and the raw message, which
travels with it, keeps them.

`decoded` gives Subject, From and To as a person reads them: unfolded, with the encoded-words
(`=?utf-8?q?Caf=C3=A9?=`, `=?iso-8859-1?b?...?=`) decoded. A value with a "B" encoded-word whose
text is not base64 at all is given as written: the email package would decode what it could
of it into garbage. Another one broken, or in an unknown charset, is kept or dropped as the
email package does; nothing here raises.
"""

from __future__ import annotations

import re
from email.headerregistry import HeaderRegistry, UnstructuredHeader
from email.parser import Parser
from email.policy import compat32
from typing import Final

_FIELD: Final = re.compile(r"[\x21-\x39\x3b-\x7e]+:")  # a field name (printable ASCII but ":") and its colon
_FOLD: Final = re.compile(r"\r\n|\r|\n")
# NUL and other controls have no place in a header's text, and PostgreSQL's text refuses NUL
# (a row refused for good): dropped from decoded values. Tabs are kept.
_CONTROL: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# Every field as unstructured text: an address header's own parser rewrites what it cannot
# parse ("<<<x" becomes "<>"), where the application wants the words that were there.
_TEXT: Final = HeaderRegistry(default_class=UnstructuredHeader, use_default_map=False)
_B_WORD: Final = re.compile(r"=\?[^?\s]+\?[bB]\?([^?]*)\?=")
_BASE64: Final = re.compile(r"[A-Za-z0-9+/=]*")  # (missing padding is forgiven, as everyone does)
DECODED: Final = ("subject", "from", "to")  # the fields `decoded` gives, by their JSON names


def header_fields(block: bytes) -> list[list[str]]:
    """[name, value] for each field of a header block, as the email package's compat32
    parser gives them from the block read as UTF-8 (a folded value keeps its line breaks)."""
    text = block.decode("utf-8", "replace")
    fields = _plain_fields(text)
    if fields is None:
        headers = Parser(policy=compat32).parsestr(text + "\r\n\r\n", headersonly=True)
        fields = [[name, str(value)] for name, value in headers.items()]
    return fields


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
    """A field's value unfolded (RFC 5322 2.2.3) with its encoded-words decoded (RFC 2047)."""
    unfolded = _FOLD.sub("", value)
    if "=?" in unfolded and not broken_b_word(unfolded):
        try:
            text = str(_TEXT(name, unfolded))
        except Exception:  # the email package's leniency has had bugs: the value as written, then
            text = unfolded
    else:
        # Without an encoded-word the email package gives the value back as it is, at a
        # hundredth of the cost: its parse was most of an inbound message's CPU (150 us of
        # about 250 for a 5 KiB message handed to a log or Sidekiq target).
        text = unfolded
    return _CONTROL.sub("", text).strip()
