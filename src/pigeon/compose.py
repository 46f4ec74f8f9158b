"""Compose: the messages of an HTTP injection, one per recipient, from raw text or parts.

A request names the envelope sender, the recipients (each with a display name, template
substitutions and metadata) and the content: either a raw RFC 5322 message or parts
(subject, from, reply-to, headers, text, HTML, attachments) that Pigeon assembles into MIME.
Either form is a Jinja2 template rendered per recipient, in a sandbox (no attribute access
to Python internals, no I/O), with undefined variables as errors: a mail that says
"Dear ," to a million people is worse than a refused recipient.

The request schema below is also the OpenAPI document's (`listener.http.openapi`), so the
document describes exactly what the server accepts.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.headerregistry import Address as HeaderAddress
from email.message import EmailMessage
from email.policy import SMTP, SMTPUTF8
from typing import Annotated, Any

import jinja2
import msgspec
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pigeon.smtp.commands import mailbox_problem

# The mailbox grammar the server checks (RFC 5321 dot-atom local part of at most 64 octets,
# domain labels; UTF-8 allowed, RFC 6531), as a JSON Schema pattern. The server also takes
# quoted local parts and address literals, which this leaves out.
_UTF8 = r"\u0080-\ud7ff\ue000-\uffff"
_ATOM = rf"[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~{_UTF8}-]+"
_LABEL = rf"[A-Za-z0-9{_UTF8}](?:[A-Za-z0-9{_UTF8}-]*[A-Za-z0-9{_UTF8}])?"
MAILBOX_PATTERN = rf"(?=[^@]{{1,64}}@){_ATOM}(?:\.{_ATOM})*@{_LABEL}(?:\.{_LABEL})*"
Email = Annotated[
    str, msgspec.Meta(max_length=256, pattern=f"^{MAILBOX_PATTERN}$", description="An address: local@domain")
]


class Address(msgspec.Struct, forbid_unknown_fields=True):
    email: Email
    name: str | None = None


class Attachment(msgspec.Struct, forbid_unknown_fields=True):
    data: str
    """The content: text, or base64 when `base64` is true."""
    content_type: Annotated[str, msgspec.Meta(pattern=r"^[^/\s]+/[^/\s]+$")] = "application/octet-stream"
    file_name: str | None = None
    content_id: str | None = None
    """Set it to make an inline part, referred to from the HTML as cid:<content_id>."""
    base64: bool = False


class Parts(msgspec.Struct, forbid_unknown_fields=True, rename={"from_": "from"}):
    from_: Address
    subject: str = ""
    reply_to: Address | None = None
    headers: dict[Annotated[str, msgspec.Meta(pattern=r"^[!-9;-~]+$")], str] = msgspec.field(default_factory=dict)
    text: str | None = None
    html: str | None = None
    attachments: list[Attachment] = msgspec.field(default_factory=list)


class InjectRecipient(msgspec.Struct, forbid_unknown_fields=True):
    email: Email
    name: str | None = None
    substitutions: dict[str, Any] = msgspec.field(default_factory=dict)
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    """Carried with the message into its log records."""


class InjectRequest(msgspec.Struct, forbid_unknown_fields=True):
    envelope_sender: Annotated[
        str, msgspec.Meta(max_length=256, pattern=f"^(?:{MAILBOX_PATTERN})?$", description='"" for the null sender')
    ]
    recipients: Annotated[list[InjectRecipient], msgspec.Meta(min_length=1, max_length=10_000)]
    content: str | Parts
    """A raw RFC 5322 message, or parts to build one from."""
    substitutions: dict[str, Any] = msgspec.field(default_factory=dict)
    """Template variables for every recipient (a recipient's own override them)."""
    template: bool = True
    """Render the content as a Jinja2 template per recipient."""
    tenant: str | None = None
    campaign: str | None = None


class ComposeError(Exception):
    """The request cannot be composed. `field` is the JSON path of the culprit."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Composed:
    """One recipient's message, CRLF line endings, ready for the intake."""

    data: bytes
    smtputf8: bool


def check_request(request: InjectRequest) -> None:
    """Address syntax, attachment encoding and template syntax, before anything is stored."""
    if request.envelope_sender and (problem := mailbox_problem(request.envelope_sender)) is not None:
        raise ComposeError(problem, "$.envelope_sender")
    for index, recipient in enumerate(request.recipients):
        if (problem := mailbox_problem(recipient.email)) is not None:
            raise ComposeError(problem, f"$.recipients[{index}].email")
    content = request.content
    if isinstance(content, Parts):
        if content.text is None and content.html is None and not content.attachments:
            raise ComposeError("parts need a text, an html or an attachment", "$.content")
        for index, attachment in enumerate(content.attachments):
            if attachment.base64:
                try:
                    base64.b64decode(attachment.data, validate=True)
                except binascii.Error as error:
                    raise ComposeError(f"not base64: {error}", f"$.content.attachments[{index}].data") from None
            if "/" not in attachment.content_type:
                raise ComposeError("must be type/subtype", f"$.content.attachments[{index}].content_type")
        for name in content.headers:
            if not name or any(c in name for c in ":\r\n ") or not name.isascii():
                raise ComposeError(f"{name!r} is not a header name", "$.content.headers")
    if request.template:
        _Templates(request)  # compiles every template: syntax errors are the request's


class Composer:
    """Renders one request for each of its recipients."""

    def __init__(self, request: InjectRequest, hostname: str, tenant_header: str, campaign_header: str) -> None:
        self._request = request
        self._hostname = hostname
        self._templates = _Templates(request) if request.template else None
        self._routing = [(tenant_header, request.tenant), (campaign_header, request.campaign)]

    def compose(self, recipient: InjectRecipient) -> Composed:
        """The recipient's message. Raises ComposeError when a template cannot be rendered."""
        request = self._request
        variables = {**request.substitutions, **recipient.substitutions}
        variables.setdefault("email", recipient.email)
        variables.setdefault("name", recipient.name or "")
        render = self._templates.renderer(variables) if self._templates is not None else _as_is
        content = request.content
        if isinstance(content, str):
            return self._raw(render("raw", content))
        return self._built(content, recipient, render)

    def _raw(self, text: str) -> Composed:
        data = _crlf(text).encode("utf-8")
        head_end = data.find(b"\r\n\r\n")
        head = data if head_end < 0 else data[: head_end + 2]
        lowered = b"\r\n" + head.lower()
        extra = []
        if b"\r\ndate:" not in lowered:
            extra.append(f"Date: {email.utils.formatdate(time.time())}\r\n")
        if b"\r\nmessage-id:" not in lowered:
            extra.append(f"Message-ID: {email.utils.make_msgid(domain=self._hostname)}\r\n")
        extra += [f"{name}: {value}\r\n" for name, value in self._routing if value]
        if not data.endswith(b"\r\n"):
            data += b"\r\n"  # SMTP carries lines: the last one ends too
        data = "".join(extra).encode() + data
        # UTF-8 in the header needs SMTPUTF8; in the body only 8BITMIME (the envelope says so).
        return Composed(data, smtputf8=not head.isascii())

    def _built(self, parts: Parts, recipient: InjectRecipient, render: _Render) -> Composed:
        message = EmailMessage()
        message["From"] = _address(parts.from_, render, "from")
        message["To"] = _mailbox(recipient.name or "", recipient.email)
        if parts.reply_to is not None:
            message["Reply-To"] = _address(parts.reply_to, render, "reply_to")
        message["Subject"] = render("subject", parts.subject)
        message["Date"] = email.utils.formatdate(time.time())
        message["Message-ID"] = email.utils.make_msgid(domain=self._hostname)
        for name, value in parts.headers.items():
            message[name] = render(f"headers.{name}", value)
        for name, routing in self._routing:
            if routing:
                message[name] = routing
        text = render("text", parts.text) if parts.text is not None else None
        html = render("html", parts.html) if parts.html is not None else None
        if text is not None:
            message.set_content(text, cte=_transfer_encoding(text))
            if html is not None:
                message.add_alternative(html, subtype="html", cte=_transfer_encoding(html))
        elif html is not None:
            message.set_content(html, subtype="html", cte=_transfer_encoding(html))
        inline = [a for a in parts.attachments if a.content_id]
        for attachment in parts.attachments:
            _attach(message, attachment, related=attachment in inline and html is not None)
        # Only addresses need SMTPUTF8: names, subjects and text are encoded to 7-bit.
        smtputf8 = not all(s.isascii() for s in (recipient.email, parts.from_.email))
        data = message.as_bytes(policy=SMTPUTF8 if smtputf8 else SMTP)
        return Composed(data, smtputf8=smtputf8)


# --- templates ---------------------------------------------------------------------------------
_Render = Callable[[str, str], str]


def _as_is(name: str, source: str) -> str:
    return source


@functools.cache
def _environment(autoescape: bool) -> ImmutableSandboxedEnvironment:
    # Strict: an undefined variable is an error for that recipient, not an empty string.
    return ImmutableSandboxedEnvironment(
        autoescape=autoescape, undefined=jinja2.StrictUndefined, keep_trailing_newline=True
    )


class _Templates:
    """Every template of a request, compiled once; rendered per recipient."""

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

    def _add(self, name: str, source: str, field: str, *, autoescape: bool) -> None:
        if "{" not in source:
            return  # nothing to render: use the text as it is
        try:
            self._compiled[name] = _environment(autoescape).from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise ComposeError(f"template syntax error, line {error.lineno}: {error.message}", field) from None

    def renderer(self, variables: Mapping[str, Any]) -> _Render:
        compiled = self._compiled

        def render(name: str, source: str) -> str:
            template = compiled.get(name)
            if template is None:
                return source
            try:
                return template.render(variables)
            except jinja2.TemplateError as error:
                raise ComposeError(f"template {name}: {error}", name) from None

        return render


# --- MIME details -----------------------------------------------------------------------------
def _address(address: Address, render: _Render, template: str) -> HeaderAddress | str:
    return _mailbox(render(template, address.name or ""), address.email)


def _mailbox(name: str, addr: str) -> HeaderAddress | str:
    if addr.isascii():
        return HeaderAddress(display_name=name, addr_spec=addr)  # the name gets encoded as needed
    # The email package refuses UTF-8 local parts as objects but writes them from text (the
    # message then goes with SMTPUTF8, where they are allowed).
    quoted = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{quoted}" <{addr}>' if name else f"<{addr}>"


def _attach(message: EmailMessage, attachment: Attachment, *, related: bool) -> None:
    payload = base64.b64decode(attachment.data) if attachment.base64 else attachment.data.encode("utf-8")
    maintype, _, subtype = attachment.content_type.partition("/")
    cid = f"<{attachment.content_id}>" if attachment.content_id else None
    if related:
        html = next(p for p in message.walk() if p.get_content_type() == "text/html")
        html.add_related(payload, maintype, subtype, cid=cid, filename=attachment.file_name)
        return
    disposition = "inline" if cid else "attachment"
    message.add_attachment(payload, maintype, subtype, disposition=disposition, cid=cid, filename=attachment.file_name)


def _transfer_encoding(text: str) -> str | None:
    """Quoted-printable for text that is not plain ASCII: it passes any server (8bit needs
    8BITMIME on every hop). None lets the library choose (7bit) for ASCII text."""
    return None if text.isascii() and max(map(len, text.splitlines()), default=0) <= 998 else "quoted-printable"


def _crlf(text: str) -> str:
    """Line endings as CRLF, whatever the client sent (JSON strings usually carry bare LF)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\r\n")
