"""IMAP search criteria read for their meaning: can a search match a message flagged \\Seen?

With `after_delivery = "seen"` a message is acknowledged by flagging it \\Seen; a search that
can still match it would find it again at every round, forever. Whether it can is a question
about the search's meaning, not its words: `NOT SEEN` excludes seen mail as `UNSEEN` does,
while `OR UNSEEN FLAGGED` names UNSEEN and matches seen flagged mail. So the criteria are
parsed by the grammar of RFC 3501 section 6.4.4 (and 9, `search-key`): keys in a row are
ANDed, NOT takes one key, OR two, a parenthesised list is keys ANDed; the other keys take
the arguments the grammar gives them (an astring, a date, a number, a sequence set), and so
do the extensions in `_ARGUMENTS` that servers commonly offer.

Each key reads as two facts, proved from its parts (each is a sufficient condition: a search
this does not prove safe is refused, never one it proves wrongly):
    excludes  every message it matches is unseen  (UNSEEN, NEW, NOT of a key that covers)
    covers    every seen message matches it       (SEEN, ALL, NOT of a key that excludes)
A row excludes if any of its keys does, and covers if all do; OR excludes if both branches
do, and covers if either does.

A search that names \\Recent (NEW is RECENT UNSEEN; OLD is NOT RECENT) is refused whatever
`after_delivery` (`recent_key`): a server gives \\Recent to one session only, and the next one
(after a stop, a reconnect, or in another node) sees the message without it, so a message left
waiting (refused for now, or still there when the session ended) would never match again.

Sharp edge: a key this module does not know has no known arity, so nothing after it can be
read with certainty: `SearchError`, naming the key. A literal ({n}) cannot be written in a
configuration value anyway.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final


class SearchError(ValueError):
    """The criteria cannot be read (`str()` says where); the server would refuse them, or
    they are beyond what this module can tell the meaning of."""


@dataclass(frozen=True, slots=True)
class _Meaning:
    excludes: bool  # every match is unseen
    covers: bool  # every seen message matches


_NOTHING: Final = _Meaning(excludes=False, covers=False)
# Keys with a meaning of their own as to \Seen; every other known key proves nothing.
_MEANINGS: Final = {
    "UNSEEN": _Meaning(excludes=True, covers=False),
    "NEW": _Meaning(excludes=True, covers=False),  # RECENT UNSEEN
    "SEEN": _Meaning(excludes=False, covers=True),
    "ALL": _Meaning(excludes=False, covers=True),
}
# Keys and how many arguments (astring, date, number, sequence set) each takes; NOT and OR,
# whose arguments are keys, are the parser's own.
_ARGUMENTS: Final = {
    # RFC 3501 6.4.4
    **dict.fromkeys(["ALL", "ANSWERED", "DELETED", "DRAFT", "FLAGGED", "NEW", "OLD", "RECENT", "SEEN"], 0),
    **dict.fromkeys(["UNANSWERED", "UNDELETED", "UNDRAFT", "UNFLAGGED", "UNSEEN"], 0),
    **dict.fromkeys(["BCC", "BODY", "CC", "FROM", "SUBJECT", "TEXT", "TO", "KEYWORD", "UNKEYWORD"], 1),
    **dict.fromkeys(["BEFORE", "ON", "SINCE", "SENTBEFORE", "SENTON", "SENTSINCE", "LARGER", "SMALLER", "UID"], 1),
    "HEADER": 2,
    # Extensions: WITHIN (RFC 5032), OBJECTID (RFC 8474), SAVEDATE (RFC 8514), FILTERS (RFC 5466), Gmail's.
    **dict.fromkeys(["OLDER", "YOUNGER", "EMAILID", "THREADID", "SAVEDBEFORE", "SAVEDON", "SAVEDSINCE"], 1),
    **dict.fromkeys(["FILTER", "X-GM-RAW", "X-GM-MSGID", "X-GM-THRID", "X-GM-LABELS"], 1),
    "SAVEDATESUPPORTED": 0,
}
_DEEPEST: Final = 100
_SEQUENCE_SET: Final = re.compile(r"(?:\d+|\*)(?::(?:\d+|\*))?(?:,(?:\d+|\*)(?::(?:\d+|\*))?)*")
# A token: a parenthesis, a quoted string (backslash escapes " and \), or an atom.
_TOKEN: Final = re.compile(r'\s*(?:([()])|("(?:[^"\\]|\\.)*")|([^\s()"]+))')


def excludes_seen(criteria: str) -> bool:
    """Whether every message the criteria match must be unseen. Raises SearchError when they
    cannot be read."""
    return _Reader(criteria).read().excludes


_RECENT: Final = frozenset({"NEW", "RECENT", "OLD"})  # the keys whose meaning is \\Recent's


def recent_key(criteria: str) -> str | None:
    """The first key of the criteria that depends on \\Recent (NEW, RECENT, OLD), or None. Keys
    read before criteria that cannot be read count; after, none can be told from arguments."""
    try:
        reader = _Reader(criteria)
    except SearchError:
        return None  # (no tokens: the server would refuse the search anyway)
    try:
        reader.read()
    except SearchError:
        pass
    return reader.recent


class _Reader:
    def __init__(self, criteria: str) -> None:
        self._tokens = _tokens(criteria)
        self._at = 0
        self._depth = 0  # keys being read, one inside the other
        self.recent: str | None = None  # the first key read that depends on \\Recent

    def read(self) -> _Meaning:
        if self._peek() == "CHARSET":  # SEARCH [CHARSET astring] keys: before the first key only
            self._at += 2
        meaning = self._row(closing=False)
        if self._at < len(self._tokens):
            raise SearchError(f"{self._tokens[self._at]!r} closes no parenthesis")
        return meaning

    def _peek(self) -> str | None:
        return self._tokens[self._at].upper() if self._at < len(self._tokens) else None

    def _row(self, *, closing: bool) -> _Meaning:
        """Keys ANDed, up to the end (or the ")" that closes the list when `closing`)."""
        meanings = []
        while (token := self._peek()) is not None and token != ")":
            meanings.append(self._key())
        if closing and token is None:
            raise SearchError("a parenthesis is not closed")
        if not meanings:
            raise SearchError("a parenthesised list is empty" if closing else "no search key")
        return _Meaning(any(m.excludes for m in meanings), all(m.covers for m in meanings))

    def _key(self) -> _Meaning:
        self._depth += 1
        try:
            return self._one_key()
        finally:
            self._depth -= 1

    def _one_key(self) -> _Meaning:
        if self._depth > _DEEPEST:  # (NOT NOT ... or (((...: a RecursionError otherwise)
            raise SearchError(f"nested more than {_DEEPEST} deep")
        token = self._peek()
        if token is None:
            raise SearchError("a search key is missing at the end")
        if token == ")":
            raise SearchError("a search key is missing before ')'")
        self._at += 1
        if token == "(":
            meaning = self._row(closing=True)
            self._at += 1  # its ")"
            return meaning
        if token == "NOT":
            inner = self._operand("NOT needs a search key")
            return _Meaning(excludes=inner.covers, covers=inner.excludes)
        if token == "OR":
            one, two = self._operand("OR needs two search keys"), self._operand("OR needs two search keys")
            return _Meaning(one.excludes and two.excludes, one.covers or two.covers)
        if _SEQUENCE_SET.fullmatch(token):
            return _NOTHING
        arguments = _ARGUMENTS.get(token)
        if arguments is None:
            raise SearchError(f"{token!r} is not a search key Pigeon knows (RFC 3501 6.4.4)")
        if token in _RECENT and self.recent is None:
            self.recent = token
        for _ in range(arguments):
            if self._peek() in (None, "(", ")"):
                raise SearchError(f"{token} needs {arguments} argument{'s' if arguments > 1 else ''}")
            self._at += 1
        return _MEANINGS.get(token, _NOTHING)

    def _operand(self, missing: str) -> _Meaning:
        if self._peek() in (None, ")"):
            raise SearchError(missing)
        return self._key()


def _tokens(criteria: str) -> list[str]:
    tokens = []
    at, end = 0, len(criteria.rstrip())
    while at < end:
        found = _TOKEN.match(criteria, at)
        if found is None:  # only an unclosed quoted string stops the pattern
            raise SearchError("a quoted string is not closed")
        if found.group(3) and found.group(3).startswith("{"):
            raise SearchError("a literal ({n}) cannot be given here: quote the string instead")
        tokens.append(found.group(found.lastindex or 0))
        at = found.end()
    return tokens
