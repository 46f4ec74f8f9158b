"""Compose: the messages of an HTTP injection, one per recipient, from raw text or parts
(raw content with nothing rendered per recipient: one for them all, `Composer.shared`).

A request names the envelope sender, the recipients (each with a display name, template
substitutions and metadata) and the content: either a raw RFC 5322 message or parts
(subject, from, reply-to, headers, text, HTML, attachments) that Pigeon assembles into MIME.
A raw message may also come as the base64 of its bytes (`content_encoding`), for mail that
is not UTF-8 (a legacy charset's 8-bit text, which SMTP takes and a JSON string cannot hold):
bytes are no template, and are sent as they are. Either text form is a Jinja2 template
rendered per recipient, in a sandbox (no attribute access
to Python internals, no I/O), with undefined variables as errors: a mail that says
"Dear ," to a million people is worse than a refused recipient. A recipient's `name` is
such a variable when it has none (none given, or blank): `{{ name }}` refuses it, while
`{{ name | default("there") }}`, `{{ name or "there" }}` and `{% if name %}` work.

The request schema below is also the OpenAPI document's (`listener.http.openapi`), so the
document describes exactly what the server accepts.
"""

from __future__ import annotations

import base64
import datetime
import email.utils
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import msgspec

from pigeon import mime
from pigeon.header_section import end_header_section
from pigeon.queue.names import MAX_PART, campaign_problem, queue_part_problem
from pigeon.smtp import address, replies

if TYPE_CHECKING:
    import jinja2

    from pigeon.rendering import HeaderBreak

# The mailbox grammar the server checks (`pigeon.smtp.address`: RFC 5321 dot-atom or quoted
# local part, domain labels or an address literal; UTF-8 allowed, RFC 6531, less control and
# format characters), as a JSON Schema pattern: what SMTP takes, this takes. Lengths are in
# octets there, characters here. UTF-8 is written as JSON Schema spells it (escapes, BMP only,
# no surrogates).
_EXTRA: Final = address.json_schema_extra()
MAILBOX_PATTERN = address.mailbox_pattern(_EXTRA)
# The same grammar in negated character classes, which match the same text and which `re`
# compiles in a millisecond where MAILBOX_PATTERN takes 40 (msgspec compiles each pattern
# when the types below are made, so every process would spend that at start): what the
# server validates with, and what the OpenAPI document replaces with the JSON Schema one.
_MAILBOX_RE = address.mailbox_pattern(_EXTRA, negated=True)
_EMAIL_RE, _SENDER_RE = f"^{_MAILBOX_RE}$", f"^(?:{_MAILBOX_RE})?$"
# A recipient may also be a bare postmaster, as `RCPT TO:<postmaster>` may (RFC 5321 4.5.1).
_RECIPIENT_RE = f"^(?:{address.POSTMASTER_PATTERN}|{_MAILBOX_RE})$"
SCHEMA_PATTERNS: Final = {
    _EMAIL_RE: f"^{MAILBOX_PATTERN}$",
    _SENDER_RE: f"^(?:{MAILBOX_PATTERN})?$",
    _RECIPIENT_RE: f"^(?:{address.POSTMASTER_PATTERN}|{MAILBOX_PATTERN})$",
}
"""The address patterns the request types validate with, each with what the OpenAPI document
writes for it: the same addresses, as JSON Schema spells them."""
_EMAIL_RULES: Final = (
    "local@domain, at most 254 octets (UTF-8) in all, 64 in the local part and 63 in each label of the domain"
    " (a U-label counted as its A-label), no control or format characters (such as bidi overrides)"
)
Email = Annotated[
    str,
    msgspec.Meta(max_length=address.MAX_ADDRESS, pattern=_EMAIL_RE, description=_EMAIL_RULES),
]
_RECIPIENT: Final = re.compile(_RECIPIENT_RE)


_BARE_POSTMASTER: Final = re.compile(f"^{address.POSTMASTER_PATTERN}$")


def recipient_problem(email: str) -> address.Problem | None:
    """Why the injection API refuses `email` as a recipient, or None: what `RecipientEmail`'s
    pattern and then `check_request` (`address.check`) find, in the words `/api/v1/inject`
    answers with (the check's text, else the syntax text), so that a door refusing such a
    recipient alone (KumoMTA's) says what the others say of it."""
    if len(email) <= address.MAX_ADDRESS and _RECIPIENT.search(email) is not None:
        return None if _BARE_POSTMASTER.match(email) else address.check(email)
    problem = address.check(email)
    return problem if problem is not None else address.Problem(address.Kind.SYNTAX, address.SYNTAX_TEXT)


RecipientEmail = Annotated[
    str,
    msgspec.Meta(
        max_length=address.MAX_ADDRESS,
        pattern=_RECIPIENT_RE,
        description=f"{_EMAIL_RULES}; or postmaster (no domain, any case), which is [smtp] postmaster, as SMTP's"
        " RCPT TO:<postmaster> is (RFC 5321 4.5.1; so is postmaster at [smtp] hostname)",
    ),
]
_DATE_FIELD: Final = re.compile(rb"\r\ndate[ \t]*:")
_MESSAGE_ID_FIELD: Final = re.compile(rb"\r\nmessage-id[ \t]*:")
MAX_NAME: Final = MAX_PART
"""The longest tenant or campaign name, in characters."""
Name = Annotated[
    str,
    msgspec.Meta(
        max_length=MAX_NAME,
        description=f"At most {MAX_NAME} characters, no white space, ':' or '@' (they would split the queue name "
        "campaign:tenant@domain), no control or format characters (such as ESC or bidi overrides)",
    ),
]


class Address(msgspec.Struct, forbid_unknown_fields=True):
    email: Email
    name: str | None = None


class Attachment(msgspec.Struct, forbid_unknown_fields=True):
    data: str
    """The content: text (encoded in the charset `content_type` names; a text/* type naming none
    gets charset=utf-8), or base64 of bytes sent as they are when `base64` is true (its line breaks
    and other ASCII white space skipped: `base64_bytes`)."""
    content_type: Annotated[
        str,
        msgspec.Meta(
            pattern=mime.MEDIA_TYPE,
            description='A media type, with any parameters: "image/png", "text/plain; charset=utf-8" (RFC 2045 5.1).'
            " Its name parameter is written from file_name: give it there. Not a composite type (multipart/*,"
            " message/*): an attachment is sent in base64, which RFC 2045 6.4 allows them not",
        ),
    ] = "application/octet-stream"
    file_name: str | None = None
    """Any text but control characters (400): written quoted, or in RFC 2231's form when it is not
    short printable ASCII (`mime.binary_part`)."""
    content_id: str | None = None
    """Set it to make an inline part, referred to from the HTML as cid:<content_id>. Printable
    ASCII without white space, <, >, (, ), " or \\ (RFC 2392: logo.png@example.org), else 400."""
    base64: bool = False


HeaderFields = Annotated[
    dict[Annotated[str, msgspec.Meta(pattern=r"^[!-9;-~]+$")], str],
    msgspec.Meta(
        description="More header fields. Date and Message-ID replace Pigeon's, and To the recipient's own"
        " (such as undisclosed-recipients:;, a group: the envelope recipients stay the recipients')."
        " Refused (400): a field Pigeon writes from the other parts (From, Reply-To, Subject, MIME-Version,"
        " Content-Type,"
        " Content-Transfer-Encoding, Content-Disposition, Content-ID), a name twice in any case, and what a"
        " submission must not carry: Return-Path (added at final delivery; see envelope_sender), Received"
        " (a trace field), DKIM-Signature (Pigeon signs), Bcc (it would show the blind copy to every"
        " recipient: list the address among the recipients)"
    ),
]
"""The more header fields of parts (`Parts.headers`; KumoMTA's `content.headers` too)."""


class Parts(msgspec.Struct, forbid_unknown_fields=True, rename={"from_": "from"}):
    from_: Address
    subject: str = ""
    reply_to: Address | None = None
    headers: HeaderFields = msgspec.field(default_factory=dict)
    text: str | None = None
    html: str | None = None
    attachments: list[Attachment] = msgspec.field(default_factory=list)


class InjectRecipient(msgspec.Struct, forbid_unknown_fields=True):
    email: RecipientEmail
    name: Annotated[
        str | None,
        msgspec.Meta(
            description="The display name in To, and the template variables `name` and `to_header`. Without one"
            " (or blank), `name` is"
            " undefined: a template that writes it out refuses this recipient (554 5.6.0) rather than sending"
            ' "Hello ,"; `{{ name | default("there") }}` or `{{ name or "there" }}` give a fallback'
        ),
    ] = None
    substitutions: dict[str, Any] = msgspec.field(default_factory=dict)
    metadata: Annotated[
        dict[str, str],
        msgspec.Meta(
            description="Carried with the message into its log records: at most [http] max_metadata_size bytes"
            " (4 KiB unless configured) as JSON"
        ),
    ] = msgspec.field(default_factory=dict)


SenderEmail = Annotated[str, msgspec.Meta(max_length=256, pattern=_SENDER_RE, description='"" for the null sender')]


class InjectRequest(msgspec.Struct, forbid_unknown_fields=True):
    envelope_sender: SenderEmail
    recipients: Annotated[
        list[InjectRecipient],
        msgspec.Meta(
            min_length=1,
            description="One message each; content that is the same for all (raw, nothing rendered per recipient)"
            " is one message for them all, stored once per [smtp] max_recipients of one metadata. At most [http]"
            " max_recipients (10,000 unless configured): beyond, 400 naming the setting, nothing stored",
        ),
    ]
    content: str | Parts
    """A raw RFC 5322 message, or parts to build one from."""
    content_encoding: Annotated[
        Literal["base64"] | None,
        msgspec.Meta(
            description='"base64": `content` is the base64 of a raw message\'s bytes (RFC 4648; line breaks and'
            " other ASCII white space are skipped, as base64(1) and MIME (RFC 2045 6.8) break it into lines),"
            " for one that is not UTF-8 (8-bit text in a legacy charset, which SMTP takes and a JSON string cannot"
            " hold). Raw content only; sent as it is, no template (`template` must be false). Its line breaks are"
            " made CRLF and it meets the checks raw text meets, with the same replies"
        ),
    ] = None
    substitutions: dict[str, Any] = msgspec.field(default_factory=dict)
    """Template variables for every recipient (a recipient's own override them)."""
    template: bool = True
    """Render the content as a Jinja2 template per recipient."""
    tenant: Name | None = None
    campaign: Name | None = None


def to_header(name: str | None, email: str) -> str:
    """The recipient's mailbox as the value of a To field, the template variable `to_header`
    (KumoMTA's predefined substitution of that name): `"John Smith" <john@example.net>`
    style, as Pigeon writes the To of parts (`mime.address_header`: the name quoted or
    RFC 2047-encoded as it needs, the domain as its A-label), or the bare address without a
    name. On one line: unfolded, so that a raw message's `To: {{ to_header }}` holds no line
    break (which a template value may not put into a header section)."""
    field = mime.address_header("To", name or "", email, mime.MAX_LINE)
    return field.removeprefix("To: ").replace("\r\n", "").rstrip()


class ComposeError(Exception):
    """The request cannot be composed. `field` is the JSON path of the culprit."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class RenderTimeSpent(ComposeError):
    """The request spent its rendering time (`[http] max_render_time`) before this recipient:
    not composed, to be sent again in another request."""


class HeaderValueError(ComposeError):
    """A template value with a line break (or another character no header may hold) rendered
    into a raw message's header section: it would start a header field of its own (a second
    From, a Bcc, all DKIM-signed) or end the header early."""


class TemplateLimitError(ComposeError):
    """A template spent a render budget (`pigeon.rendering`): the request's fault, whoever
    the recipient, so it is refused whole when the first recipient's render hits it."""


@dataclass(frozen=True, slots=True)
class Composed:
    """One recipient's message, CRLF line endings, ready for the intake."""

    data: bytes
    smtputf8: bool
    own: int = 0
    """Octets of `data` that Pigeon wrote on its own, not counted against max_message_size, as
    SMTP counts none of what it adds: its Date and Message-ID, the request's `tenant` and
    `campaign` fields, and in raw content the line end and empty line it put in."""


def check_request(
    request: InjectRequest, *, max_metadata_size: int = 4096, max_line_length: int = mime.MAX_LINE
) -> None:
    """Address syntax, header values, attachment encoding and template syntax, before anything
    is stored.

    A value written into a header as it is (tenant, campaign, an attachment's type, file name
    and content id) must not hold a CR or LF: it would end the header and start whatever
    follows, up to a bare-LF end of data that a lenient next hop takes (SMTP smuggling).
    Values that are folded into a header (names, subject, header values) or are text have
    their line breaks unfolded or made CRLF; none may hold a NUL, which some MTAs truncate at.

    What the composer cannot fold (an address, a header field's name, an attachment's type
    and content id) must fit a line of `max_line_length` (`[smtp] max_line_length`), or every
    message made of it would be refused by the content check, which Pigeon's own are held to
    as a client's are.
    """
    if request.envelope_sender and (problem := address.check(request.envelope_sender)) is not None:
        raise ComposeError(problem.text, "$.envelope_sender")
    for value, field in ((request.tenant, "$.tenant"), (request.campaign, "$.campaign")):
        _as_is_in_header(value, field)
        check = campaign_problem if field == "$.campaign" else queue_part_problem
        if value is not None and (refused := check(value)) is not None:
            raise ComposeError(f"{field.removeprefix('$.')} {refused} (it names a queue)", field)
        if value:  # (one word: on a line of its own at worst)
            _fits(f" {value}", max_line_length, field)
    for index, recipient in enumerate(request.recipients):
        if (problem := address.check(recipient.email)) is not None:
            raise ComposeError(problem.text, f"$.recipients[{index}].email")
        if not isinstance(request.content, str):  # (raw content has its own To, if any)
            _address_fits(recipient.email, max_line_length, f"$.recipients[{index}].email")
        if recipient.metadata and (size := len(msgspec.json.encode(recipient.metadata))) > max_metadata_size:
            raise ComposeError(
                f"metadata is {size} bytes as JSON, over [http] max_metadata_size ({max_metadata_size})",
                f"$.recipients[{index}].metadata",
            )
        _no_nul(recipient.name, f"$.recipients[{index}].name")
    content = request.content
    if request.content_encoding is not None:
        _check_encoded(request)
    elif isinstance(content, str):
        _no_nul(content, "$.content")
    else:
        if content.text is None and content.html is None and not content.attachments:
            raise ComposeError("parts need a text, an html or an attachment", "$.content")
        header_addresses = [(content.from_, "$.content.from.email"), (content.reply_to, "$.content.reply_to.email")]
        for header_address, field in header_addresses:
            if header_address is not None and (problem := address.check(header_address.email)) is not None:
                raise ComposeError(problem.text, field)
            if header_address is not None:
                _address_fits(header_address.email, max_line_length, field)
        _no_nul(content.from_.name, "$.content.from.name")
        _no_nul(content.reply_to.name if content.reply_to else None, "$.content.reply_to.name")
        _no_nul(content.subject, "$.content.subject")
        _no_nul(content.text, "$.content.text")
        _no_nul(content.html, "$.content.html")
        for name, value in content.headers.items():
            _no_nul(value, f"$.content.headers.{name}")
        content_ids: dict[str, int] = {}  # each with the index of its attachment
        for index, attachment in enumerate(content.attachments):
            where = f"$.content.attachments[{index}]"
            _as_is_in_header(attachment.content_type, f"{where}.content_type")
            _as_is_in_header(attachment.file_name, f"{where}.file_name")
            if attachment.file_name is not None and (found := _CONTROL.search(attachment.file_name)):
                raise ComposeError(
                    _CONTROL_TEXT.format(code=ord(found.group()), at=found.start()), f"{where}.file_name"
                )
            _as_is_in_header(attachment.content_id, f"{where}.content_id")
            if attachment.base64:
                base64_bytes(attachment.data, f"{where}.data")
            _check_parameters(attachment, f"{where}.content_type")
            attachment_content(attachment, where)  # text in a charset that can hold it
            # Folded between its parameters at worst: each must fit a line of its own.
            kind, parameters = mime.media_type(attachment.content_type)
            if kind.partition("/")[0].lower() in COMPOSITE_TYPES:
                raise ComposeError(_COMPOSITE_TEXT.format(kind=kind), f"{where}.content_type")
            _fits(f"Content-Type: {kind};", max_line_length, f"{where}.content_type")
            for name, value in parameters:
                _fits(f" {name}={value};", max_line_length, f"{where}.content_type")
            if attachment.content_id is not None:
                if not CONTENT_ID.fullmatch(attachment.content_id):
                    raise ComposeError(_CONTENT_ID_TEXT, f"{where}.content_id")
                _fits(f" <{attachment.content_id}>", max_line_length, f"{where}.content_id")
                if attachment.content_id in content_ids:
                    raise ComposeError(
                        f"is the content id of $.content.attachments[{content_ids[attachment.content_id]}] too:"
                        " each part's must be its own (RFC 2045 7), or cid: finds either",
                        f"{where}.content_id",
                    )
                content_ids[attachment.content_id] = index
        seen: dict[str, str] = {}
        for name in content.headers:
            if not name or any(c in name for c in ":\r\n ") or not name.isascii():
                raise ComposeError(f"{name!r} is not a header name", "$.content.headers")
            lowered = name.lower()
            if lowered in seen:
                raise ComposeError(
                    f"{name!r} is {seen[lowered]!r} again (names are case-insensitive)", f"$.content.headers.{name}"
                )
            seen[lowered] = name
            _fits(f"{name}: ", max_line_length, f"$.content.headers.{name}")
            if (refusal := _NOT_SUBMITTED.get(lowered)) is not None:
                raise ComposeError(f"{name!r} {refusal}", f"$.content.headers.{name}")
            if (made_by := _BUILT_FROM.get(lowered)) is not None or lowered in _MIME_FIELDS:
                # A second From (or Subject, ...) breaks RFC 5322 5.6, and many receivers refuse it.
                raise ComposeError(
                    f"{name!r} is written by Pigeon from {made_by or _PARTS}: set it there",
                    f"$.content.headers.{name}",
                )
            value = content.headers[name]
            if not (request.template and "{" in value):  # (a template's is checked as it is rendered)
                _given_field(name, value, max_line_length)
    if request.template:
        _Templates(request)  # compiles every template: syntax errors are the request's


_FORBIDDEN: Final = (("\r", "CR"), ("\n", "LF"), ("\0", "NUL"))
_AS_IS_TEXT: Final = "must not contain a {name}: the value is written into a header as it is"
_PARTS: Final = "the parts (text, html, attachments)"
_BUILT_FROM: Final = {
    "from": "$.content.from",
    "reply-to": "$.content.reply_to",
    "subject": "$.content.subject",
    "mime-version": _PARTS,
}
"""Fields Pigeon writes in a message made of parts, and where a request sets them. (To, Date
and Message-ID, which it writes too, a request's `headers` may set instead.)"""
_MIME_FIELDS: Final = frozenset({"content-type", "content-transfer-encoding", "content-disposition", "content-id"})
"""What the message's top part carries, made from the parts."""
_REPLACEABLE: Final = frozenset({"to", "date", "message-id"})
"""Fields Pigeon writes in a message made of parts unless its `headers` give them: a To given
replaces the recipient's own (`undisclosed-recipients:;` for bulk mail), the envelope
recipients staying those of `$.recipients`."""
_NOT_SUBMITTED: Final = {
    "return-path": "is added at final delivery (RFC 5321 4.4), from the envelope: give the bounce address as"
    " $.envelope_sender",
    "received": "is a trace field each hop adds of itself (RFC 5321 4.4); Pigeon writes its own",
    "dkim-signature": "is written by Pigeon's [[dkim]] signing, over the message as it is stored",
    "bcc": "would show the blind copy's address to every recipient: list the address in $.recipients instead",
}
"""Fields a submission in parts must not carry: trace fields, a signature that is Pigeon's
to make, and a Bcc, which in the one message every recipient gets leaks the blind copy."""
CONTENT_ID: Final = re.compile(r"[!#-'*-;=?-\[\]-~]+")
"""An attachment's content id, the inside of its `Content-ID: <...>` (RFC 2392, RFC 5322
3.6.4's id-left@id-right, loosely: `cid:logo` is common): printable ASCII without white space
or what would end or break the angle brackets and comments of the field."""
COMPOSITE_TYPES: Final = ("multipart", "message")
"""The composite top-level media types (RFC 2046 5), which no attachment may declare."""
_COMPOSITE_TEXT: Final = (
    "{kind} is a composite media type (multipart/*, message/*), whose body may not be base64-encoded"
    " (RFC 2045 6.4, RFC 2046 5.2.1) as every attachment is: give a discrete type, such as"
    " application/octet-stream (a message to attach: with a file_name ending .eml)"
)
_CONTENT_ID_TEXT: Final = (
    'not a content id: printable ASCII without white space, <, >, (, ), " or \\, such as'
    " logo.png@example.org (RFC 2392); it is written as Content-ID: <content_id>"
)


def _given_field(name: str, value: str, max_line_length: int) -> str:
    """A field of the request's `headers`, as `mime.field` writes it; ComposeError naming it
    when it cannot be (a msg-id or URL that is not ASCII, an address list that is not one)."""
    try:
        return mime.field(name, value, max_line_length)
    except ValueError as error:
        raise ComposeError(f"{name} {error}", f"$.content.headers.{name}") from None


def _as_is_in_header(value: str | None, field: str) -> None:
    for char, name in _FORBIDDEN:
        if value is not None and char in value:
            # Named in the text too ("tenant must not ..."): a sentence, not the field's predicate.
            raise ComposeError(f"{field.rpartition('.')[2]} {_AS_IS_TEXT.format(name=name)}", field)


_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_TEXT: Final = (
    "must not contain a control character (U+{code:04X} at {at}): a file name is a header parameter, where"
    " one is no text, and readers show or save it differently"
)


def attachment_content(attachment: Attachment, where: str = "$.content.attachments[]") -> tuple[bytes, str]:
    """An attachment's bytes and the content type to send them with.

    Base64 data is bytes, sent as they are with the type as given (a text/* type without a
    charset then says nothing of theirs: the client knows it, Pigeon does not). Text is
    encoded in the charset the type names, and a text/* type that names none gets
    `charset=utf-8` with the UTF-8 bytes: without one, readers take text/* for US-ASCII
    (RFC 2045 5.2) and show UTF-8 as mojibake. ComposeError (naming the field under `where`)
    when the charset is unknown or cannot hold the text."""
    if attachment.base64:
        return base64_bytes(attachment.data, f"{where}.data"), attachment.content_type
    kind, parameters = mime.media_type(attachment.content_type)
    charset = next((value.strip('"') for name, value in parameters if name.lower() == "charset"), None)
    if charset is None:
        text_type = kind.partition("/")[0].lower() == "text"
        content_type = (
            f"{attachment.content_type.rstrip(' ' + chr(9))}; charset=utf-8" if text_type else attachment.content_type
        )
        return attachment.data.encode("utf-8"), content_type
    try:
        return attachment.data.encode(charset), attachment.content_type
    except LookupError:
        raise ComposeError(
            f"names the charset {charset!r}, which Pigeon does not know", f"{where}.content_type"
        ) from None
    except UnicodeEncodeError as error:
        raise ComposeError(
            f"cannot be written in the charset its content type names ({charset}): {error.object[error.start]!r} at"
            f" {error.start}; give a charset that holds it (utf-8), or the bytes in base64",
            f"{where}.data",
        ) from None


def _check_parameters(attachment: Attachment, field: str) -> None:
    """An attachment's content type names each parameter once, and no `name` when there is a
    `file_name` to write it from: a reader would take either of two."""
    try:
        _, parameters = mime.media_type(attachment.content_type)
    except ValueError as error:  # (a request the schema checked has none such)
        raise ComposeError(str(error), field) from None
    seen: set[str] = set()
    for name, _ in parameters:
        lowered = name.lower()
        if lowered in seen:
            raise ComposeError(f"names the parameter {name!r} twice (names are case-insensitive)", field)
        seen.add(lowered)
        if lowered == "name" and attachment.file_name:
            raise ComposeError("has a name parameter, and Pigeon writes it from file_name: give it there alone", field)


def media_type_problem(value: str) -> str:
    """What is wrong with an attachment's content type the request's schema refused."""
    for char, name in _FORBIDDEN:
        if char in value:
            return _AS_IS_TEXT.format(name=name)
    return mime.MEDIA_TYPE_TEXT


def _address_fits(email: str, max_line_length: int, field: str) -> None:
    # As the header field writes it: its A-label form, on a line of its own at worst.
    _fits(f" <{address.with_a_label(email)}>", max_line_length, field)


def _fits(line: str, max_line_length: int, field: str) -> None:
    """ComposeError unless `line`, which cannot be folded, fits a line of the message."""
    if (octets := len(line.encode("utf-8", "surrogatepass"))) > max_line_length:
        raise ComposeError(
            f"too long for a header line, where it cannot be folded: {octets} octets on its line, over [smtp]"
            f" max_line_length ({max_line_length}), which the message would be refused for",
            field,
        )


# The reply SMTP reception refuses such a message with (`replies.CONTENT_NUL`), its code too,
# as every other content error over HTTP carries it: every door says it alike.
_NUL_TEXT: Final = str(replies.CONTENT_NUL)


def _no_nul(value: str | None, field: str) -> None:
    if value is not None and "\0" in value:
        raise ComposeError(_NUL_TEXT, field)


def _check_encoded(request: InjectRequest) -> None:
    """Raw content given as the base64 of its bytes: raw, not a template, base64, no NUL (as
    raw text may hold none)."""
    if not isinstance(request.content, str):
        raise ComposeError(
            "only raw content (a string) is given in base64: parts are text, and an attachment has its own `base64`",
            "$.content_encoding",
        )
    if request.template:
        raise ComposeError(
            "content in base64 is bytes, sent as they are, not a Jinja2 template: set template to false", "$.template"
        )
    if b"\0" in encoded_content(request):
        raise ComposeError(_NUL_TEXT, "$.content")


def encoded_content(request: InjectRequest) -> bytes:
    """The bytes of raw content given in base64 (`content_encoding`); ComposeError naming
    `$.content` when it is not base64."""
    assert isinstance(request.content, str)
    return base64_bytes(request.content, "$.content")


_BASE64_WHITE_SPACE: Final = str.maketrans("", "", " \t\n\r\v\f")
"""ASCII white space, which base64 broken into lines holds (`base64_bytes`)."""


def base64_bytes(text: str, field: str) -> bytes:
    """The bytes `text` is the base64 of (RFC 4648 4, padded), ComposeError naming `field` when
    it is not. Its ASCII white space is skipped: base64(1) and MIME writers break base64 into
    lines of 76 columns (RFC 2045 6.8, whose decoders ignore the line breaks), and end it with
    one. Any other character outside the alphabet is refused, as is base64url's `-` and `_`."""
    try:
        return base64.b64decode(text.translate(_BASE64_WHITE_SPACE), validate=True)
    except ValueError as error:  # binascii.Error, or a character beyond ASCII
        raise ComposeError(f"not base64: {error}", field) from None


class Composer:
    """Renders one request for each of its recipients."""

    def __init__(
        self,
        request: InjectRequest,
        hostname: str,
        tenant_header: str,
        campaign_header: str,
        *,
        max_output: int = 64 * 1024 * 1024,
        max_render_time: float = 10.0,
        max_line_length: int = mime.MAX_LINE,
    ) -> None:
        """`max_output`: the most characters one template may render (the message size limit);
        `max_render_time`: seconds all of the request's renders may take together;
        `max_line_length`: the longest line the content check takes (`[smtp] max_line_length`),
        which every line Pigeon writes keeps within (text in quoted-printable, headers folded)."""
        self._request = request
        self._max_line = max_line_length
        self._max_output = max_output
        self._render_time_left = max_render_time
        self._hostname = hostname
        self._templates = _Templates(request) if request.template else None
        self._routing = [(tenant_header, request.tenant), (campaign_header, request.campaign)]
        self._encoded: tuple[list[mime.Part], list[mime.Part]] | None = None
        # Raw content given as bytes (base64), its line breaks made CRLF, once for every recipient.
        self._bytes = _crlf_bytes(encoded_content(request)) if request.content_encoding is not None else None

    @property
    def shared(self) -> bool:
        """Whether every recipient's message is the same bytes: raw content with nothing rendered
        per recipient (`template` false, bytes, or a template without a `{`). Such a message is
        composed once, with one Date and Message-ID, and stored once for many recipients, as SMTP
        stores one body for all the recipients of a transaction."""
        return isinstance(self._request.content, str) and (self._templates is None or self._templates.empty)

    def _variables(self, recipient: InjectRecipient) -> dict[str, Any]:
        variables = {**self._request.substitutions, **recipient.substitutions}
        variables.setdefault("email", recipient.email)
        variables.setdefault("to_header", to_header(recipient.name, recipient.email))
        if recipient.name and not recipient.name.isspace():
            variables.setdefault("name", recipient.name)
        elif "name" not in variables:
            # No name is not an empty one: "Hello {{ name }}" sent "Hello " to every recipient
            # without one. It is undefined, as any variable not given is, yet false where a
            # template tests it, so `{{ name or "there" }}` and `default` work.
            from pigeon.rendering import no_name  # (imported already: the request has templates)

            variables["name"] = no_name()
        return variables

    def check_header_values(self) -> None:
        """Raw content: `HeaderValueError` naming the value when any recipient's template
        variable puts a line break (or control character) into the header section, before
        anything is composed or stored, so the request is refused whole, as for a `tenant`
        with a CR. Only the recipients whose variables hold such a character are rendered, and
        only up to the end of the header, within the request's rendering time; a render that
        fails otherwise is left to `compose`, which refuses that recipient."""
        request = self._request
        if self._templates is None or not isinstance(request.content, str):
            return
        shared = _holds_header_break(request.substitutions)
        for index, recipient in enumerate(request.recipients):
            if not (shared or _holds_header_break(recipient.substitutions) or _holds_header_break(recipient.name)):
                continue
            if self._render_time_left <= 0:
                return  # `compose` refuses the rest with 451, and checks each it renders
            started = time.monotonic()
            try:
                variables = self._variables(recipient)
                self._templates.check_header(variables, self._max_output, index, recipient, request.substitutions)
            finally:
                self._render_time_left -= time.monotonic() - started

    def check_routing(self) -> None:
        """`ComposeError` naming the header when the content sets the tenant (or campaign)
        header while the request's own `tenant` (`campaign`) is given: two answers to one
        question, of which the one inside the content is most likely a mistake (left, it
        named the queue of parts, and raw content carried both). Raw content's header
        section is read as the template's text: a field name made by a template is not seen,
        and the request's value, written first, names the queue."""
        content = self._request.content
        if isinstance(content, str):
            data = self._bytes if self._bytes is not None else _crlf(content).encode("utf-8")
            data, end = end_header_section(data)
            head = b"\r\n" + data[:end].lower()
        for (name, value), json_field in zip(self._routing, ("$.tenant", "$.campaign"), strict=True):
            if not value:
                continue
            if isinstance(content, str):
                culprits = [("$.content", name)] if _field_in(head, name) else []
            else:
                culprits = [(f"$.content.headers.{h}", h) for h in content.headers if h.lower() == name.lower()]
            for field, header in culprits:
                raise ComposeError(f"{header} is set here and by {json_field}: give it in one place", field)

    def compose(self, recipient: InjectRecipient) -> Composed:
        """The recipient's message. Raises ComposeError when a template cannot be rendered."""
        if self._templates is None:
            return self._compose(recipient, _as_is)
        variables = self._variables(recipient)
        if self._render_time_left <= 0:
            raise RenderTimeSpent("the request's rendering time ([http] max_render_time) is spent", "$.recipients")
        started = time.monotonic()
        try:
            return self._compose(recipient, self._templates.renderer(variables, self._max_output))
        finally:
            self._render_time_left -= time.monotonic() - started

    def _compose(self, recipient: InjectRecipient, render: _Render) -> Composed:
        content = self._request.content
        if isinstance(content, str):
            if self._bytes is not None:  # bytes: no template
                return self._raw(self._bytes)
            return self._raw(_crlf(render("raw", content)).encode("utf-8"))
        return self._built(content, recipient, render)

    def _raw(self, data: bytes) -> Composed:
        given = len(data)  # what max_message_size counts: the client's message, as over SMTP
        if data and not data.endswith(b"\r\n"):
            data += b"\r\n"  # SMTP carries lines: the last one ends too
        # The header section ends at the empty line, or at the first line that neither starts
        # a field nor continues one: there the body starts, after an empty line put in, as
        # Postfix's cleanup makes of such mail (a text with no header at all is all body),
        # and as every door reads it (`pigeon.intake`).
        data, end = end_header_section(data)
        if end == len(data):  # all header (or nothing): the empty line ends it, as it always has here
            data += b"\r\n"
        head = data[:end]
        lowered = b"\r\n" + head.lower()
        extra = []
        if not _DATE_FIELD.search(lowered):
            extra.append(f"Date: {_now()}\r\n")
        if not _MESSAGE_ID_FIELD.search(lowered):
            extra.append(mime.message_id_field(self._hostname, self._max_line))
        extra += [mime.plain_field(name, value, self._max_line) for name, value in self._routing if value]
        data = "".join(extra).encode() + data
        # UTF-8 in the header asks for SMTPUTF8; in the body only 8BITMIME (the envelope says
        # so). 8-bit text in another charset (raw bytes) is no UTF-8: 8BITMIME, as SMTP takes it
        # from a client that asks for no SMTPUTF8. Asked for is not needed: delivery sends such
        # a header with SMTPUTF8 where offered, with BODY=8BITMIME where not, whatever the door.
        return Composed(data, smtputf8=not head.isascii() and mime.is_utf8(head), own=len(data) - given)

    def _built(self, parts: Parts, recipient: InjectRecipient, render: _Render) -> Composed:
        # Address fields are written whole by `mime.address_header`, never through `mime.header`:
        # that one is for unstructured text, and made the address part of an encoded word.
        max_line = self._max_line
        given = {name.lower() for name in parts.headers} & _REPLACEABLE
        head = [mime.address_header("From", render("from", parts.from_.name or ""), parts.from_.email, max_line)]
        if "to" not in given:
            head.append(mime.address_header("To", recipient.name or "", recipient.email, max_line))
        if parts.reply_to is not None:
            reply_to = render("reply_to", parts.reply_to.name or "")
            head.append(mime.address_header("Reply-To", reply_to, parts.reply_to.email, max_line))
        head.append(mime.header("Subject", render("subject", parts.subject)))
        own = []  # not counted against max_message_size (`Composed.own`)
        if "date" not in given:
            own.append(f"Date: {_now()}\r\n")
        if "message-id" not in given:
            own.append(mime.message_id_field(self._hostname, self._max_line))
        head += own
        # The routing fields (the request's, or named in `headers`) go as they are, as in raw
        # content: the intake names the queue from their text, which it does not decode (the
        # RFC 2047 words a long or non-ASCII tenant was made named a queue "=?utf-8?q?...?=").
        # They come off before delivery: a UTF-8 one asks for no SMTPUTF8.
        routing_names = {name.lower() for name, _ in self._routing}
        routing = [
            mime.plain_field(name, render(f"headers.{name}", value), self._max_line)
            for name, value in parts.headers.items()
            if name.lower() in routing_names
        ]
        requested = [mime.plain_field(name, value, self._max_line) for name, value in self._routing if value]
        routing += requested
        head += [
            _given_field(name, render(f"headers.{name}", value), max_line)
            for name, value in parts.headers.items()
            if name.lower() not in routing_names
        ]
        head.append("MIME-Version: 1.0\r\n")
        body = self._body(parts, render)
        # Names, subjects and text are encoded to 7-bit, and an address is written with its
        # A-label where it has one: what is left in UTF-8 is a local part that is not ASCII
        # (From, To or Reply-To), which asks for SMTPUTF8 (RFC 6532 3; delivery sends it as
        # 8-bit data to a server without it). Asked for too when the envelope needs it as it
        # goes on the wire (`smtp.client.needs_smtputf8`); an A-label alone asks for nothing.
        header = "".join(head)
        envelope = (self._request.envelope_sender, recipient.email)
        smtputf8 = not header.isascii() or not all(address.with_a_label(a).isascii() for a in envelope)
        own_size = len("".join(own + requested).encode("utf-8"))
        return Composed((header + "".join(routing)).encode("utf-8") + body.to_bytes(), smtputf8=smtputf8, own=own_size)

    def _body(self, parts: Parts, render: _Render) -> mime.Part:
        max_line = self._max_line
        text = mime.text_part(render("text", parts.text), "plain", max_line) if parts.text is not None else None
        html = mime.text_part(render("html", parts.html), "html", max_line) if parts.html is not None else None
        inline, attached = self._attachments(parts)
        if text is not None and html is not None:
            body = mime.multipart("alternative", [text, html])
        else:
            body = text or html or mime.text_part("", "plain")
        if inline and html is not None:
            root = "multipart/alternative" if text is not None else "text/html"
            body = mime.multipart("related", [body, *inline], root_type=root)
        else:
            attached = inline + attached
        return mime.multipart("mixed", [body, *attached]) if attached else body

    def _attachments(self, parts: Parts) -> tuple[list[mime.Part], list[mime.Part]]:
        """Inline and attached parts, encoded once for all the recipients of the request."""
        if self._encoded is None:
            inline: list[mime.Part] = []
            attached: list[mime.Part] = []
            for attachment in parts.attachments:
                data, content_type = attachment_content(attachment)
                part = mime.binary_part(
                    data,
                    content_type,
                    file_name=attachment.file_name,
                    content_id=attachment.content_id,
                    max_line=self._max_line,
                )
                (inline if attachment.content_id else attached).append(part)
            self._encoded = (inline, attached)
        return self._encoded


# --- templates ---------------------------------------------------------------------------------
_Render = Callable[[str, str], str]


RAW_TEMPLATE = (
    ' (raw content is rendered as a Jinja2 template: "template": false, or pigeon inject without --template,'
    " sends it as it is)"
)
"""Said after a raw message's template error: a whole message that was meant to go as it is
(a `{{` or `{#` in its text) is refused, or would lose text, only for being read as a template."""


def _as_is(name: str, source: str) -> str:
    return source


class _Templates:
    """Every template of a request, compiled once; rendered per recipient.

    Jinja2 (`pigeon.rendering`) is imported by the first request that holds a template, not
    with this module: it takes some 40 ms, which every process would otherwise spend at start
    and which a node whose clients send no templates never needs."""

    def __init__(self, request: InjectRequest) -> None:
        self._compiled: dict[str, jinja2.Template] = {}
        content = request.content
        if isinstance(content, str):
            self._add("raw", content, "$.content", autoescape=False)
            return
        self._add("subject", content.subject, "$.content.subject", autoescape=False)
        self._add("from", content.from_.name or "", "$.content.from.name", autoescape=False)
        if content.reply_to is not None:
            self._add("reply_to", content.reply_to.name or "", "$.content.reply_to.name", autoescape=False)
        for name, value in content.headers.items():
            self._add(f"headers.{name}", value, f"$.content.headers.{name}", autoescape=False)
        if content.text is not None:
            self._add("text", content.text, "$.content.text", autoescape=False)
        if content.html is not None:
            self._add("html", content.html, "$.content.html", autoescape=True)

    @property
    def empty(self) -> bool:
        """Whether no text of the request is a template (none holds a `{`): nothing is rendered."""
        return not self._compiled

    def _add(self, name: str, source: str, field: str, *, autoescape: bool) -> None:
        if "{" not in source:
            return  # nothing to render: use the text as it is
        import jinja2

        from pigeon import rendering

        try:
            self._compiled[name] = rendering.environment(autoescape).from_string(source)
        except jinja2.TemplateSyntaxError as error:
            why = f"template syntax error, line {error.lineno}: {error.message}"
            raise ComposeError(why + (RAW_TEMPLATE if name == "raw" else ""), field) from None
        except RecursionError:
            raise ComposeError("template nested too deeply to compile", field) from None

    def check_header(
        self,
        variables: Mapping[str, Any],
        max_output: int,
        index: int,
        recipient: InjectRecipient,
        shared: Mapping[str, Any],
    ) -> None:
        """Raw content's header section rendered: `HeaderValueError` naming the culprit if a
        value puts a line break into it. Any other failure is left to the full render."""
        template = self._compiled.get("raw")
        if template is None:
            return
        from pigeon import rendering

        try:
            rendering.render(template, variables, max_output=max_output, header_only=True)
        except rendering.HeaderBreak as error:
            raise _header_value_error(error, variables, index, recipient, shared) from None
        except Exception:  # the template's fault: `compose` says so for this recipient
            return

    def renderer(self, variables: Mapping[str, Any], max_output: int) -> _Render:
        compiled = self._compiled
        if not compiled:
            return _as_is
        import jinja2  # (imported already: by `_add`)

        from pigeon import rendering

        def render(name: str, source: str) -> str:
            template = compiled.get(name)
            if template is None:
                return source
            try:
                return rendering.render(template, variables, max_output=max_output, header=name == "raw")
            except rendering.HeaderBreak as error:
                raise _header_value_error(error, variables, None, None) from None
            except rendering.RenderLimit as error:
                raise TemplateLimitError(f"template {name}: {error}", name) from None
            except jinja2.TemplateError as error:
                raise ComposeError(f"template {name}: {error}{RAW_TEMPLATE if name == 'raw' else ''}", name) from None
            except Exception as error:  # whatever a template makes Python raise is the template's
                why = f"template {name}: {type(error).__name__}: {error}"
                raise ComposeError(why + (RAW_TEMPLATE if name == "raw" else ""), name) from None

        return render


def _holds_header_break(value: Any) -> bool:
    """Whether a template variable holds, in any string or key, a character no header may."""
    from pigeon.rendering import NOT_IN_HEADER

    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if NOT_IN_HEADER.search(item) is not None:
                return True
        elif isinstance(item, dict):
            stack += item.keys()
            stack += item.values()
        elif isinstance(item, list | tuple):
            stack += item
    return False


def _header_value_error(
    error: HeaderBreak,
    variables: Mapping[str, Any],
    index: int | None,
    recipient: InjectRecipient | None,
    variables_given: Mapping[str, Any] | None = None,
) -> HeaderValueError:
    """The refusal, naming the variable (and, when known, its JSON path) that brought it."""
    # The variable whose value was put out, else the first that holds such a character.
    holders = [name for name, value in variables.items() if _holds_header_break(value)]
    exact = [name for name in holders if isinstance(variables[name], str) and variables[name] in error.value]
    culprit = next(iter(exact or holders), None)
    why = f"{error}: it would start a header field of its own or end the header (only the template's text may)"
    if culprit is None:
        return HeaderValueError(f"template raw: {why}", "$.content")
    field = "$.content"
    if index is not None and recipient is not None:
        if culprit in recipient.substitutions:
            field = f"$.recipients[{index}].substitutions.{culprit}"
        elif culprit == "name" and "name" not in (variables_given or {}):
            field = f"$.recipients[{index}].name"
        else:
            field = f"$.substitutions.{culprit}"
    return HeaderValueError(f"template variable {culprit!r}: {why}", field)


# --- raw content -----------------------------------------------------------------------------
def _now() -> str:
    """The Date of a message made now: UTC as "+0000" ("-0000" would say the zone is unknown,
    RFC 5322 3.3)."""
    return email.utils.format_datetime(datetime.datetime.now(datetime.UTC))


def _field_in(head: bytes, name: str) -> bool:
    """Whether `head` (a lowered header section after a CRLF) has a field called `name`."""
    return re.search(rb"\r\n" + re.escape(name.lower().encode()) + rb"[ \t]*:", head) is not None


def _crlf(text: str) -> str:
    """Line endings as CRLF, whatever the client sent (JSON strings usually carry bare LF)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\r\n")


def _crlf_bytes(data: bytes) -> bytes:
    """`_crlf` for raw content's bytes (a file with LF line endings, base64-encoded)."""
    return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").replace(b"\n", b"\r\n")
