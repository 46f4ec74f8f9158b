"""POST /api/inject/v1: KumoMTA's injection API, so that its clients move to Pigeon unchanged.

A request of KumoMTA's shape (`envelope_sender`, `recipients` of `{email, name, substitutions}`,
`substitutions`, `content` as a raw RFC 5322 string or as a builder object with `text_body`,
`html_body`, `from`, `subject`, `reply_to`, `headers` and `attachments`) is read into Pigeon's
own (`compose.InjectRequest`) and carried out by the one pipeline of `POST /api/v1/inject`
(`inject.inject_through`): the same token and scope (`inject`), tenant bindings, limits, policy
hooks, content checks and log records. The tenant and campaign come from the content's
`X-Tenant` and `X-Campaign` headers (`[delivery] tenant_header`, `campaign_header`), as in a
KumoMTA set-up with the queues helper's `tenant_header` and `campaign_header`.

What KumoMTA takes that Pigeon does otherwise:

* `template_dialect`: `"Jinja"` (KumoMTA's default, MiniJinja) is Pigeon's Jinja2, which reads
  the same templates for common use; `"Static"` sends the content as it is (Pigeon's
  `"template": false`). `"Handlebars"` is refused (400 naming it).
* `deferred_generation`: taken, and the messages are made and stored before the answer, as
  without it: the answer waits (KumoMTA answers at once, with `success_count` 0), and says
  what was taken.
* `deferred_spool`: taken, and the messages are stored durably all the same: Pigeon answers
  for nothing it has not stored.
* `trace_headers`: taken; Pigeon writes its own Received field on every message, and no
  supplemental (`X-KumoRef`) field.
* `amp_html_body`: refused (400 naming it): Pigeon builds no text/x-amp-html part.

The answer is KumoMTA's: 200 with `{success_count, fail_count, failed_recipients, errors}`
once the request was carried out, even when every recipient failed (each error is the
recipient, ": " and the SMTP-style reply refusing it: a 4xx one may be sent again later). A
request refused whole (malformed, no token, another tenant's, too large) is answered as
Pigeon's API answers it: 4xx with `{error, field}`, the field named as this request names it
(`$.content.text_body`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final

import msgspec
from aiohttp import web

from pigeon.compose import (
    Address,
    Attachment,
    ComposeError,
    HeaderFields,
    InjectRecipient,
    InjectRequest,
    Parts,
    SenderEmail,
)
from pigeon.listener.http.inject import Door, InjectResponse, inject_through


class KumoRecipient(InjectRecipient, forbid_unknown_fields=True):
    """Pigeon's recipient (`compose.InjectRecipient`), its address checked per recipient, as
    KumoMTA does: one that is no address is refused alone (`501 5.1.3` or `553 5.1.3` with the
    text SMTP and `/api/v1/inject` give, in `failed_recipients`), the others injected
    (`Door.addresses_alone`)."""

    email: Annotated[  # (a wider type than Pigeon's: checked per recipient, later)
        str,
        msgspec.Meta(
            max_length=4096,
            description="A recipient address, as /api/v1/inject's; one that is none is refused alone (501 or 553"
            " 5.1.3 and what /api/v1/inject says of it, in failed_recipients), and the others are injected, as"
            " KumoMTA does",
        ),
    ]


class KumoContent(msgspec.Struct, forbid_unknown_fields=True, rename={"from_": "from"}):
    """KumoMTA's builder content: what Pigeon's parts (`compose.Parts`) are, by other names."""

    from_: Annotated[
        Address | None, msgspec.Meta(description="Required by Pigeon (a message without From is refused)")
    ] = None
    subject: str | None = None
    reply_to: Address | None = None
    headers: HeaderFields | None = None
    text_body: str | None = None
    html_body: Annotated[
        str | None,
        msgspec.Meta(
            description="A Jinja2 template that HTML-escapes what it writes out ({{ value | safe }} does not)"
        ),
    ] = None
    amp_html_body: Annotated[
        str | None, msgspec.Meta(description="Refused (400) unless null: Pigeon builds no text/x-amp-html part")
    ] = None
    attachments: list[Attachment] | None = None


class KumoTraceHeaders(msgspec.Struct, forbid_unknown_fields=True):
    """Taken for KumoMTA's clients, to no effect: Pigeon writes its Received field on every
    message, and no supplemental (X-KumoRef) field."""

    received_header: bool = False
    supplemental_header: bool = True
    header_name: str = "X-KumoRef"
    include_meta_names: list[str] = msgspec.field(default_factory=list)


class KumoInjectRequest(msgspec.Struct, forbid_unknown_fields=True):
    envelope_sender: SenderEmail
    recipients: Annotated[
        list[KumoRecipient],
        msgspec.Meta(
            min_length=1,
            description="One message each. At most [http] max_recipients (10,000 unless configured): beyond, 400"
            " naming the setting, nothing stored",
        ),
    ]
    content: Annotated[
        str | KumoContent,
        msgspec.Meta(
            description="A raw RFC 5322 message (a Jinja2 template as a whole, unless template_dialect is Static),"
            " or a builder object"
        ),
    ]
    substitutions: dict[str, Any] = msgspec.field(default_factory=dict)
    template_dialect: Annotated[
        str | None,
        msgspec.Meta(
            description='"Jinja" (the default: Pigeon\'s Jinja2, for KumoMTA\'s MiniJinja) or "Static" (no'
            ' template: sent as it is); "Handlebars" is refused (400)'
        ),
    ] = None
    deferred_generation: Annotated[
        bool,
        msgspec.Meta(
            description="Taken, to no effect: the messages are made and stored before the answer, which says"
            " what was taken"
        ),
    ] = False
    deferred_spool: Annotated[
        bool, msgspec.Meta(description="Taken, to no effect: every message is stored durably before the answer")
    ] = False
    trace_headers: KumoTraceHeaders | None = None


class KumoInjectResponse(msgspec.Struct):
    success_count: int
    fail_count: int
    failed_recipients: Annotated[list[str], msgspec.Meta(description="The addresses refused, in request order")]
    errors: Annotated[
        list[str],
        msgspec.Meta(
            description='Why, for each: the address, ": " and an SMTP-style reply ("550 5.1.0 ...");'
            " a 4xx one may be sent again later"
        ),
    ]


_DECODER: Final = msgspec.json.Decoder(KumoInjectRequest)
_DIALECTS: Final = {None: True, "Jinja": True, "Static": False}
"""KumoMTA's template dialects Pigeon renders, each with whether the content is a template."""
# Pigeon's member names in a refusal, as this request names them.
_RENAMED: Final = {"$.content.text": "$.content.text_body", "$.content.html": "$.content.html_body",
                   "$.template": "$.template_dialect"}  # fmt: skip
_OWN_NAME: Final = re.compile(r"Object contains unknown field `(text|html)` - at `\$\.content`")
"""msgspec's refusal of Pigeon's own name of a part (`text`, `html`) in KumoMTA's content."""
_PIGEON_MEMBER: Final = re.compile(r"\$\.(?:content\.(?:text|html)|template)(?=$|[.\[])")


def _decode(body: bytes) -> InjectRequest:
    """KumoMTA's request as Pigeon's: ComposeError naming what Pigeon does not do."""
    try:
        kumo = _DECODER.decode(body)
    except msgspec.ValidationError as error:
        # Pigeon's own names for the parts, which a client of both APIs may send here: said so.
        if (own := _OWN_NAME.fullmatch(str(error))) is not None:
            name = own.group(1)
            raise ComposeError(
                f"{error.args[0].partition(' - at ')[0]}: KumoMTA's names it {name}_body", f"$.content.{name}"
            ) from None
        raise
    if kumo.template_dialect not in _DIALECTS:
        raise ComposeError(
            f'template dialect {kumo.template_dialect!r} is not taken: Pigeon renders Jinja2 templates ("Jinja",'
            ' which reads as KumoMTA\'s MiniJinja for common use) or none ("Static")',
            "$.template_dialect",
        )
    recipients: list[InjectRecipient] = list(kumo.recipients)
    content: str | Parts
    if isinstance(kumo.content, str):
        content = kumo.content
    else:
        built = kumo.content
        if built.amp_html_body is not None:
            raise ComposeError(
                "Pigeon builds no AMP part (text/x-amp-html): leave amp_html_body out (text_body and html_body are"
                " sent), or send the whole message as raw content",
                "$.content.amp_html_body",
            )
        if built.from_ is None:
            raise ComposeError("a message needs a From: give content.from (Pigeon writes From from it)", "$.content")
        if built.text_body is None and built.html_body is None and not built.attachments:
            raise ComposeError("the content needs a text_body, an html_body or an attachment", "$.content")
        content = Parts(
            built.from_,
            subject=built.subject or "",
            reply_to=built.reply_to,
            headers=built.headers or {},
            text=built.text_body,
            html=built.html_body,
            attachments=built.attachments or [],
        )
    return InjectRequest(
        kumo.envelope_sender,
        recipients,
        content,
        substitutions=kumo.substitutions,
        template=_DIALECTS[kumo.template_dialect],
    )


def _field(field: str) -> str:
    """A member named as Pigeon's request names it, named as KumoMTA's does."""
    return _PIGEON_MEMBER.sub(lambda found: _RENAMED[found.group(0)], field)


def _answer(response: InjectResponse, status: int) -> web.Response:
    """KumoMTA's answer: 200 whatever became of the recipients (Pigeon's 422 and 503 say so
    in the status), each refused one in `failed_recipients` and `errors`."""
    failed = [result for result in response.recipients if result.id is None]
    answer = KumoInjectResponse(
        success_count=response.accepted,
        fail_count=response.failed,
        failed_recipients=[result.email for result in failed],
        errors=[f"{result.email}: {result.error}" for result in failed],
    )
    return web.Response(body=msgspec.json.encode(answer), content_type="application/json")


KUMO_DOOR: Final = Door(_decode, _field, _answer, addresses_alone=True)


async def inject_kumo(request: web.Request) -> web.Response:
    return await inject_through(request, KUMO_DOOR)
