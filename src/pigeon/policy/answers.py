"""What policy hooks may answer. `None` (or no return statement) always means "go on as usual".

| hook                  | may return                                  |
|-----------------------|---------------------------------------------|
| `on_connect`          | `Refuse`                                    |
| `on_mail_from`        | `Refuse`                                    |
| `on_rcpt_to`          | `Refuse`                                    |
| `on_message`          | `Refuse`, `Changes`                         |
| `before_delivery`     | `Defer`, `Fail`, `Reroute`                  |
| `on_delivery_outcome` | `Reclassify`                                |

Each answer checks itself when it is made: a hook that builds an impossible one (a 250
"refusal", a header name with a colon) raises there, and that counts as the hook failing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from pigeon.config.patterns import PatternError, domain_name
from pigeon.queue.names import campaign_problem, queue_name_problem, queue_part_problem
from pigeon.smtp import address

_ENHANCED: Final = re.compile(r"[245]\.\d{1,3}\.\d{1,3}")
_HEADER_NAME: Final = re.compile(r"[!-9;-~]+")  # RFC 5322 2.2: printable ASCII but the colon
_SHOWN: Final = 80  # characters of a refused value in the error, so a 1 MB name makes no 1 MB log line
_FOLD_AT: Final = 78  # RFC 5322 2.1.1: lines SHOULD be at most 78 characters...
_LINE_LIMIT: Final = 998  # ...and MUST be at most 998, without the CRLF
_FOLD_POINT: Final = re.compile(r"(?<=[^ \t])[ \t]+(?=[^ \t])")  # a run of WSP inside the value
# RFC 5321 4.2: a reply's text is `textstring`, HT and printable US-ASCII: a client that did
# not ask for SMTPUTF8 cannot take UTF-8 there, nor can a terminal take a control character.
_REPLY_TEXT: Final = re.compile(r"[\t -~]*")
_REPLY_LINE: Final = 512  # RFC 5321 4.5.3.1.5: octets in a reply line, its code and CRLF included
_WORD: Final = re.compile(r"([ \t]*)([^ \t]+)")  # a word and the white space before it


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def _str(value: object, what: str) -> None:
    """Raise TypeError naming the field if `value` is no str: not left to fail in code the hook's
    author never saw (`argument of type 'int' is not iterable`)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__} {_shown(value)}")


def _one_line(value: str, what: str) -> None:
    if any(char in value for char in "\r\n\0"):
        raise ValueError(f"{what} must be one line without NUL: {value!r}")


def folded_field(name: str, value: str) -> str:
    """`name: value`, folded (RFC 5322 2.2.3: a CRLF put before white space the value has)
    so that its lines keep to 78 octets where the value's words allow. Unfolded, it is the
    value again. Raises ValueError if a line stays over 998 octets: a word that long, which
    a receiving server may refuse (554 5.6.0) and cannot be folded."""
    text = f"{name}: {value}"
    if len(text) <= _FOLD_AT and text.isascii():
        return text  # the usual case
    start = len(name) + 2  # not at the space after the colon: the first line holds a word
    cuts = [m.start() for m in _FOLD_POINT.finditer(text, start)]
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    lines = [pieces[0]]
    for piece in pieces[1:]:  # each but the first starts with the white space to fold before
        if len((lines[-1] + piece).encode("utf-8")) <= _FOLD_AT:
            lines[-1] += piece
        else:
            lines.append(piece)
    longest = max(len(line.encode("utf-8")) for line in lines)
    if longest > _LINE_LIMIT:
        raise ValueError(
            f"header {name}'s value cannot be folded into lines of at most {_LINE_LIMIT} octets "
            f"(RFC 5322 2.1.1): a line of {longest} octets has no white space to fold at"
        )
    return "\r\n".join(lines)


def reply_lines(text: str, code: int, enhanced: str) -> tuple[str, ...]:
    """`text` as the lines of a reply with this code and enhanced code, each line within
    RFC 5321's 512 octets (4.5.3.1.5): cut at its white space where it must be, as the lines
    of a multi-line reply (`550-5.7.1 ...`); joined again with a space, it is the text. Raises
    ValueError for a word longer than a line can hold: no reply can carry it."""
    width = _REPLY_LINE - len(f"{code}-{enhanced} \r\n")
    if len(text) <= width:
        return (text,)  # the usual case
    lines: list[str] = []
    line = ""
    for space, word in _WORD.findall(text):
        if len(word) > width:
            raise ValueError(
                f"a refusal's text holds a word of {len(word)} characters, {_shown(word)}: a reply line "
                f"holds at most {_REPLY_LINE} octets (RFC 5321 4.5.3.1.5), {width} of them text after "
                f"'{code} {enhanced} '; longer text is cut into lines at its white space, never inside a word"
            )
        if not line:
            line = word
        elif len(line) + len(space) + len(word) <= width:
            line += space + word
        else:
            lines.append(line)
            line = word
    lines.append(line)
    return tuple(lines)


@dataclass(frozen=True, slots=True)
class Refuse:
    """Refuse the connection, the command or the message with this reply.

    `code` is 4xx (try again later) or 5xx (never). `enhanced` defaults to X.7.1 (delivery not
    authorized) of the code's class. At connect time a refusal closes the connection; a
    greeting can only be 554 or 421 ("not now"), so another 5xx is sent as 554, a 4xx as 421.
    Over HTTP, a request whose every recipient is refused gets 422 (5xx refusals) or 503 (4xx).

    `text` is printable ASCII (and tabs), as every client can take a reply's text (RFC 5321
    4.2); a text too long for one reply line is sent as several (`reply_lines`), but a word
    longer than a line cannot be: either is refused as it is made (the hook fails).
    """

    code: int = 550
    text: str = "refused by policy"
    enhanced: str | None = None

    def __post_init__(self) -> None:
        # RFC 5321 4.2: a reply code's second digit is 0 to 5 (4.2.1); a 460 or 599 is none a
        # client knows (found from outside: Refuse(599) went out as "599 5.7.1").
        if not isinstance(self.code, int) or not 400 <= self.code <= 599 or self.code // 10 % 10 > 5:
            raise ValueError(
                f"a refusal's code is 400 to 599, its second digit 0 to 5 (RFC 5321 4.2.1), not {_shown(self.code)}"
            )
        _str(self.text, "Refuse text")
        _one_line(self.text, "a refusal's text")
        if not _REPLY_TEXT.fullmatch(self.text):
            raise ValueError(
                f"a refusal's text must be printable ASCII (RFC 5321 4.2: a client that did not ask for SMTPUTF8 "
                f"cannot take UTF-8 in a reply), not {_shown(self.text)}"
            )
        if self.enhanced is not None:
            _str(self.enhanced, "Refuse enhanced")
        if self.enhanced is not None and (
            not _ENHANCED.fullmatch(self.enhanced) or self.enhanced[0] != str(self.code)[0]
        ):
            raise ValueError(f"enhanced code {self.enhanced!r} does not fit {self.code} (e.g. 5.7.1 for 550)")
        reply_lines(self.text, self.code, self.enhanced_code)

    @property
    def enhanced_code(self) -> str:
        """`enhanced`, or X.7.1 (delivery not authorized) of the code's class."""
        return self.enhanced or ("5.7.1" if self.code >= 500 else "4.7.1")


@dataclass(frozen=True, slots=True)
class Changes:
    """`on_message`: take the message, changed. Every field left at None changes nothing.

    * `tenant`, `campaign`: the parts of its scheduled queue name (`campaign:tenant@domain`);
      "" clears one. The routing headers (X-Tenant, X-Campaign) still come off on the way out.
    * `queue`: the scheduled queue name itself, replacing `campaign:tenant@domain` (the
      `[[queue]]` retry settings match it, and admin selectors its parts: "cb:t@x.test" is
      campaign cb's mail; `tenant` and `campaign` are left as they are). Mail of an
      `[[inbound]]` route keeps its own.
      1 to 255 printable characters, no white space, no `->`, not starting `inbound:`;
      another is refused as it is made (the hook fails: 451 4.3.0 and a PolicyFailure).
    * `route`: route as if the recipients were in this domain ([[route]] tables and MX
      lookup apply to it); "" routes by the recipients' domain. A domain name, checked as a
      `[[route]] domain` is (`pigeon.config.patterns.domain_name`), or an address literal;
      another is refused as it is made (the hook fails).
    * `egress_pool`: the egress pool to send from (kept with the message); "" names none:
      its `[[queue]]`'s pool, else `[delivery] pool`, as for None.
    * `dkim`: names of the `[[dkim]]` signers to sign with; an empty list: do not sign.
    * `add_headers`: (name, value) fields put on top of the message (below its trace fields:
      Received, Return-Path), in this order. A value
      is given as one line; Pigeon folds it at its white space into lines of at most 78
      octets where it can (`folded_field`), and refuses one with a line it cannot fold
      under 998 octets. A value that is not ASCII makes the message need SMTPUTF8
      (RFC 6532): it then goes only to servers that offer it.
    * `remove_headers`: names of fields to take off (every field of that name, any case),
      but for Pigeon's own Received field (the first: a next hop's loop detection and hop
      count rely on it). From only with a From in `add_headers` (a message must have one).

    * `sender`: the envelope sender (MAIL FROM) the message is stored and sent with, as
      Postfix's `sender_canonical_maps` rewrites it: its bounces and DSNs go there, and
      its records say it (a Reception's `original_sender` says the one it came with).
      "" is the null sender `<>` (no DSN is ever sent for it). Checked as MAIL FROM is
      at the SMTP door (`pigeon.smtp.address.check`); one that is not a mailbox is
      refused as it is made (the hook fails: 451 4.3.0 and a PolicyFailure). One that is
      not ASCII makes the message need SMTPUTF8, as an SMTPUTF8 MAIL FROM does. The From
      header is not changed (`add_headers` and `remove_headers` do that).

    Header edits are made on the way out; the stored message is not rewritten, and DKIM
    signs the edited message.
    """

    tenant: str | None = None
    campaign: str | None = None
    queue: str | None = None
    route: str | None = None
    egress_pool: str | None = None
    dkim: Sequence[str] | None = None
    add_headers: Sequence[tuple[str, str]] = ()
    remove_headers: Sequence[str] = ()
    sender: str | None = None

    def __post_init__(self) -> None:
        self._check_types()
        # As MAIL FROM is checked at the SMTP door (SMTPUTF8 allowed: it makes the message
        # need it): a sender no next hop takes would only come back as a bounce to nobody.
        if self.sender and (refused := address.check(self.sender)) is not None:
            raise ValueError(f"sender {_shown(self.sender)}: {refused.text}")
        for what, check in (("tenant", queue_part_problem), ("campaign", campaign_problem)):
            value = getattr(self, what)
            if value is not None and (problem := check(value)) is not None:
                raise ValueError(f"{what} {_shown(value)}: {problem} (it names a queue)")
        # A malformed queue name is refused here, as the hook answers: the message then gets
        # 451 4.3.0 and a PolicyFailure, rather than a name that breaks its queue or its logs.
        if self.queue is not None and (problem := queue_name_problem(self.queue)) is not None:
            raise ValueError(f"queue {_shown(self.queue)}: {problem}")
        if self.route:  # ("": by the recipients' own domains)
            _route_problem(self.route, "route")
        if self.egress_pool is not None and any(c.isspace() for c in self.egress_pool):
            raise ValueError(f"egress_pool {self.egress_pool!r} must not hold white space")
        if isinstance(self.dkim, str):
            raise ValueError("dkim is a list of signer names, e.g. dkim=['example.org'], not a string")
        for name, value in self.add_headers:
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a header name")
            _one_line(value, f"header {name}'s value")
            folded_field(name, value)
        for name in self.remove_headers:
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a header name")
        if any(name.lower() == "from" for name in self.remove_headers) and not any(
            name.lower() == "from" for name, _ in self.add_headers
        ):
            # It would leave unsigned (DKIM needs From) and be refused by most receivers.
            raise ValueError(
                "remove_headers takes From off and add_headers puts no From on: "
                "a message must have one (RFC 5322 3.6), and DKIM signs it"
            )

    def _check_types(self) -> None:
        """A hook is plain Python: a value of the wrong type is refused naming the field, not
        left to fail later in code the hook's author never saw (`object of type 'int' has no
        len()`)."""
        for what in ("tenant", "campaign", "route", "egress_pool", "sender"):  # (`queue`: queue_name_problem says)
            value = getattr(self, what)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{what} must be a str or None, not {type(value).__name__} {value!r:.80}")
        if self.dkim is not None and not isinstance(self.dkim, str) and not _strs(self.dkim):
            raise TypeError(f"dkim must be a list of signer names (str), not {self.dkim!r:.80}")
        if not _sequence(self.add_headers) or not all(
            _sequence(field) and len(field) == 2 and _strs(field) for field in self.add_headers
        ):
            raise TypeError(f"add_headers must be a list of (name, value) pairs of str, not {self.add_headers!r:.80}")
        if not _strs(self.remove_headers):
            raise TypeError(f"remove_headers must be a list of header names (str), not {self.remove_headers!r:.80}")


def _route_problem(route: str, what: str) -> None:
    """Raise ValueError if `route` is no domain name, as a `[[route]] domain` is checked
    (`domain_name`): found from outside, `route="a..b"` was taken with 250, then failed its
    MX lookup at every retry until max_age."""
    try:
        domain_name(route)
    except PatternError as error:
        raise ValueError(f"{what} {_shown(route)} {error}") from None


def _sequence(value: object) -> bool:
    return isinstance(value, (list, tuple))


def _strs(value: object) -> bool:
    """A list or tuple of str."""
    return isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value)


@dataclass(frozen=True, slots=True)
class Defer:
    """`before_delivery`: do not send now; a transient failure (`451 4.7.0 <reason>`, logged
    as TransientFailure, counted as an attempt). `delay`: seconds until the next attempt
    (default: the queue's backoff); never past `max_age`."""

    reason: str = "deferred by policy"
    delay: float | None = None

    def __post_init__(self) -> None:
        _str(self.reason, "Defer reason")
        _one_line(self.reason, "a deferral's reason")
        if self.delay is not None and (not isinstance(self.delay, (int, float)) or isinstance(self.delay, bool)):
            # (found from outside: `delay="soon"` said "'>=' not supported between 'str' and 'int'")
            raise TypeError(
                f"Defer delay must be seconds (an int or a float) or None, not {type(self.delay).__name__} "
                f"{_shown(self.delay)}"
            )
        if self.delay is not None and not self.delay >= 0:
            raise ValueError(f"delay is seconds, 0 or more, not {self.delay!r}")


@dataclass(frozen=True, slots=True)
class Fail:
    """`before_delivery`: do not send; a permanent failure of every recipient (a Bounce,
    and a DSN to the sender as for any bounce)."""

    reason: str = "refused by policy"
    code: int = 550
    enhanced: str = "5.7.1"

    def __post_init__(self) -> None:
        _str(self.reason, "Fail reason")
        _one_line(self.reason, "a failure's reason")
        if (
            not isinstance(self.code, int)
            or not 500 <= self.code <= 559  # (a second digit of 0 to 5: RFC 5321 4.2.1)
            or self.code // 10 % 10 > 5
            or not isinstance(self.enhanced, str)
            or not _ENHANCED.fullmatch(self.enhanced)
            or self.enhanced[0] != "5"
        ):
            raise ValueError(
                f"a failure is a 5xx (500 to 559) with a 5.x.y enhanced code, not {_shown(self.code)} "
                f"{_shown(self.enhanced)}"
            )


@dataclass(frozen=True, slots=True)
class Reroute:
    """`before_delivery`: do not send it there; route it as if its recipients were in
    `domain` ("" for their own domain again), at once, as an operator's rebind would: no
    attempt is counted, nothing is logged. Rerouting to where it is already routed sends it.
    Mail of an `[[inbound]]` route is not rerouted (a rebind leaves it alone too): it goes to
    its target, and a warning says the answer was not carried out. `domain` is checked as
    `Changes.route` is: one that is no domain name is refused as it is made (the hook fails)."""

    domain: str

    def __post_init__(self) -> None:
        if not isinstance(self.domain, str):
            raise TypeError(
                f'Reroute domain must be a str (a domain name, or "" for the recipients\' own), '
                f"not {type(self.domain).__name__} {_shown(self.domain)}"
            )
        if self.domain:
            _route_problem(self.domain, "Reroute domain")


@dataclass(frozen=True, slots=True)
class Reclassify:
    """`on_delivery_outcome`: treat some failures as another kind than their code says.

    `transient`: recipients whose permanent failure (5xx) is retried instead (the reply is
    logged as a 4xx, its original text kept); `permanent`: recipients whose transient failure
    is a bounce instead (as a 550, its enhanced code made 5.x.y; `classification` names its
    bounce class, else the rule table's). Either is a list of recipient addresses or "all"
    (every recipient of that kind).
    A recipient that was delivered cannot be reclassified: the hook then counts as failed
    and the attempt keeps its own classification. Nor can one be named in both (by address,
    in any case, or by "all", which names every recipient): that answer contradicts itself,
    and is refused as it is made (the hook fails, and the attempt keeps its own outcome).
    """

    transient: Sequence[str] | Literal["all"] = ()
    permanent: Sequence[str] | Literal["all"] = ()
    classification: str | None = None

    def __post_init__(self) -> None:
        # Of the types it names, as `Changes` checks its own (found from outside: `transient=[5]`
        # was silently ignored, and `classification=5` written as a number into the Bounce).
        for what in ("transient", "permanent"):
            value = getattr(self, what)
            if isinstance(value, str) and value != "all":
                raise ValueError(f'{what} is a list of addresses or "all", not {_shown(value)}')
            if not isinstance(value, str) and not _strs(value):
                raise TypeError(f'{what} must be a list of addresses (str) or "all", not {_shown(value)}')
        if self.classification is not None and not isinstance(self.classification, str):
            raise TypeError(f"classification must be a str (a bounce class) or None, not {_shown(self.classification)}")
        # Applied one after the other, such an answer would make a failure transient and then
        # permanent again ("550 policy made it permanent: 450 policy made it transient: 550"):
        # which of the two the hook meant, nothing says.
        transient, permanent = self.transient, self.permanent
        if transient == "all" or permanent == "all":
            if transient == permanent:
                raise ValueError(
                    'Reclassify makes "all" both transient and permanent: name each recipient in one at most'
                )
            everyone, named, kind = (
                ("transient", permanent, "permanent") if transient == "all" else ("permanent", transient, "transient")
            )
            if named:
                raise ValueError(
                    f'Reclassify makes "all" {everyone} and {_shown(named[0])} {kind}: "all" names every recipient; '
                    "name each recipient in one at most"
                )
            return
        both = {address.lower() for address in transient} & {address.lower() for address in permanent}
        if both:
            raise ValueError(
                f"Reclassify makes {_shown(min(both))} both transient and permanent: name each recipient in one at most"
            )
