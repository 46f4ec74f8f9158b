"""POST /api/v1/inject: mail from an application, one message per recipient.

Content that is every recipient's alike (raw content with nothing rendered per recipient:
`Composer.shared`) is one message for them all, as over SMTP: composed once and stored once
for up to `[smtp] max_recipients` recipients of one metadata, one spool message per domain
(`_shared_messages`). What a request has the spool store is at most `[http] max_stored_size`:
413 beyond, nothing stored.

The answer comes once every accepted recipient's message is durable in the spool (the same
group commit as SMTP reception), and says, per recipient in request order, its spool id or
why it was refused. A malformed request changes nothing and gets 400 naming the field; that
includes a CR, LF or NUL in a value that would be written into a header as it is, and a
template value that would put a line break into a raw message's header section. A request
refused whole (400, 413, 415) is logged as one `Rejection` of command `inject` naming the
token, as SMTP logs a refused command; one without a known token (401, 403) is not. Each
recipient's composed message then meets the content check of SMTP reception (bare LF or CR,
NUL, over-long lines, a field RFC 5322 3.6 allows once there twice, no From, a Date or
Message-ID not of RFC 5322's syntax, over max_message_size (counting none of what Pigeon
wrote: its Date, Message-ID), a loop's Received fields, an X-Tenant that cannot name a
queue): one that fails is refused with the reply SMTP would give (554 5.6.0, 552 5.3.4).
Content that is not a template (`template` false) is every recipient's alike: failing the
check, it refuses the request (400 naming `$.content`, with that reply), as a first
recipient's message over max_message_size does whatever `template` says (as a render past
that size does), and as a repeated field (no From, a bad Date or Message-ID, an X-Tenant or
X-Campaign that cannot name a queue) in the first recipient's message does; a field given
among the parts' `headers` is named there (`$.content.headers.X-Campaign`), as a tenant the
token may not name is (403).

A recipient may be a bare `postmaster`, and `postmaster@<hostname>` in any case is it too:
delivered to `[smtp] postmaster`, as `RCPT TO:<postmaster>` is (`address.is_postmaster`), and
found as a repeat of another spelling of it.

The policy's hooks are asked as for SMTP: what SMTP reception refuses, injection refuses too.
`on_mail_from` once for the envelope sender (a refusal refuses every recipient with its
reply), `on_rcpt_to` for each recipient in request order (a refusal refuses that one), both
before anything is composed; then `on_message` about each recipient's message. Their objects
are filled as `on_message`'s are for HTTP: the request's `session` (`http-` and an id of the form SMTP's), the client's
address, no HELO, no TLS, the API token's name as `auth_user`. A refused recipient is logged
as a `Rejection` of command `inject` and counted in `pigeon_rejections_total`. When no
recipient is taken, the status says why: 422 if they were all refused for good (5xx: by the
policy, a template, the size...), 503 if any refusal was temporary (a 4xx, the spool's, or a failing policy hook's
`451 4.3.0`); the body names each recipient's reply either way.

A token bound to tenants (`[[http.token]] tenants`) may name no other: a request whose
`tenant`, or whose content's tenant header, names another is refused whole, 403 naming that
field (and logged as a `Rejection`), before any policy hook is asked about its `tenant`, or
when its first recipient's message is composed (after the checks of what can name a tenant
at all, as SMTP reception asks them: a value that names none is 400 whoever the token); a
later recipient whose own rendering names another gets `550 5.7.1`. With one tenant, a
request naming none is that tenant's.

A recipient whose domain's `[[route]]` is reserved for other tenants (`[[route]] tenants`)
than its mail's (the request's tenant, or its token's) is refused, `550 5.7.1`, before the
policy is asked about it; a message whose tenant only its content (or the policy) names is
refused so by the intake, at its commit.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Final

import msgspec
from aiohttp import web

from pigeon.compose import (
    Composed,
    ComposeError,
    Composer,
    InjectRecipient,
    InjectRequest,
    RenderTimeSpent,
    TemplateLimitError,
    check_request,
    media_type_problem,
    recipient_problem,
)
from pigeon.config.schema import Config
from pigeon.header_section import author_missing_in, malformed_field_in, repeated_field_in
from pigeon.intake import Arrival, ClientGone, Draft, Intake, Refused, Stored
from pigeon.listener.http.body import declared_too_large, read_body, too_large_text
from pigeon.listener.http.context import NODE_KEY
from pigeon.listener.http.json_body import (
    lone_surrogate,
    lone_surrogate_refusal,
    member_path,
    members,
    number_out_of_range,
    out_of_range_text,
    repeated_member,
    repeated_refusal,
    require_json,
    span_at,
    too_many_values,
)
from pigeon.logs.peer_text import shown
from pigeon.logs.records import Rejection, Response
from pigeon.message import Envelope, Recipient, format_id
from pigeon.policy import objects
from pigeon.policy.answers import Refuse
from pigeon.policy.hooks import POLICY_ERROR, HookFailed, Verdict, refusal
from pigeon.smtp import address, replies
from pigeon.smtp.framing import check_message
from pigeon.smtp.replies import Reply
from pigeon.spool.spool import SpoolError

_log = logging.getLogger(__name__)
_DECODER: Final = msgspec.json.Decoder(InjectRequest)
# msgspec's path of what it refused; "`key` in" it when a mapping's key was the trouble.
_FIELD: Final = re.compile(r" - at (`key` in )?`(\$[^`]*)`$")
# Composing runs on the loop: it gives the loop a turn at least this often (seconds), so
# that SMTP and the other requests go on meanwhile, however slow the templates.
_YIELD_AFTER: Final = 0.02
# A request's session id, `http-` and then one of the form SMTP's are (`pigeon.listener.smtp`):
# a prefix drawn at the process's start and a count, so that the workers of a node, and its
# runs, never give two requests one id (a count alone starts at 1 in each of them).
_SESSION_PREFIX: Final = secrets.token_hex(4)
_requests = itertools.count(1)
FORWARDED_PEER: Final = "X-Pigeon-Peer"
INJECT_PATH: Final = "/api/v1/inject"
KUMO_INJECT_PATH: Final = "/api/inject/v1"
"""KumoMTA's injection API (`kumo`), onto this one."""
INJECT_PATHS: Final = (INJECT_PATH, KUMO_INJECT_PATH)
"""The paths that inject: what the supervisor hands a worker as an injection (its 413 and 415
the worker's to log, its client watched)."""
# The request's body, once it is known to be of a size and shape that can be decoded.
_BODY: Final = web.RequestKey("pigeon_inject_body", bytes)


class InjectResponse(msgspec.Struct):
    accepted: int
    failed: int
    recipients: list[RecipientResult]


class RecipientResult(msgspec.Struct, omit_defaults=True):
    email: str
    id: Annotated[str | None, msgspec.Meta(description="The spool id of the recipient's message, when accepted")] = None
    error: Annotated[
        str | None, msgspec.Meta(description='Why not, when refused: an SMTP-style reply ("550 5.1.0 ...")')
    ] = None
    duplicate_of: Annotated[
        int | None,
        msgspec.Meta(
            description="When refused (550 5.1.0) as a repeat of an earlier recipient of the request: that one's"
            " index in `recipients` (the same local part, the domain in any case)"
        ),
    ] = None


class ErrorResponse(msgspec.Struct):
    """Every error the API answers has this shape, whoever finds it (`errors.json_errors`)."""

    error: str
    field: Annotated[
        str | None,
        msgspec.Meta(
            description='What in the request is at fault: the JSON path of a value, e.g. "$.recipients[2].email"'
            ' ("$": the body as a whole), the name of a query or path parameter ("cluster", "id") or of a header'
            ' ("Content-Type", "Authorization"); null when no one part is (no such path or method, the node'
            " busy or failing)"
        ),
    ]


@dataclass(frozen=True, slots=True)
class Door:
    """An API that injects through this module: how it reads a request into Pigeon's own
    (`InjectRequest`), names its members in a refusal, and answers. Pigeon's own
    (`POST /api/v1/inject`) and KumoMTA's (`kumo`): one pipeline behind both, so that the
    tokens, tenants, limits, hooks, checks and logging are the same at either."""

    decode: Callable[[bytes], InjectRequest]
    """The request, or msgspec's ValidationError or DecodeError, or ComposeError naming a field."""
    field: Callable[[str], str]
    """The request's name of a member named as Pigeon's (`$.content.text`)."""
    answer: Callable[[InjectResponse, int], web.Response]
    """The answer to a request carried out, given Pigeon's and its status (200, 422, 503)."""
    addresses_alone: bool = False
    """A recipient whose `email` is no address is refused alone (`501 5.1.3` or `553 5.1.3`, saying
    what `/api/v1/inject` says of it: `compose.recipient_problem`), and the others
    are injected, as KumoMTA does; else (Pigeon's API) the whole request is refused (400)."""


def _pigeon_answer(response: InjectResponse, status: int) -> web.Response:
    return _json(response, status)


PIGEON_DOOR: Final = Door(_DECODER.decode, lambda field: field, _pigeon_answer)


async def inject(request: web.Request) -> web.Response:
    return await inject_through(request, PIGEON_DOOR)


async def inject_through(request: web.Request, door: Door) -> web.Response:
    """Carry out an injection request that came through `door`."""
    node = request.app[NODE_KEY]
    # A request without a known token is refused (401, 403) from its headers and not logged:
    # anyone could fill the log with those. SMTP logs a failed AUTH, which a throttle bounds
    # and which costs the client a password check; a token check costs it nothing.
    holder = node.tokens.holder(request, "inject")
    tenants = node.tokens.binding(holder)  # (as the token is now: a reload may come during the request)
    session = f"http-{_SESSION_PREFIX}{next(_requests):06x}"
    try:
        return await _inject(request, holder, session, tenants, door)
    except web.HTTPClientError as refused:
        # Refused whole for its content or envelope (400, 413, 415): logged as SMTP logs a
        # refused command, so that an operator finds why an application's mail never came.
        renamed = _renamed(refused, door)
        _log_refusal(request, renamed, holder, session)
        raise renamed from None
    except _NamedAsSent as sent:
        _log_refusal(request, sent.refusal, holder, session)
        raise sent.refusal from None


def _renamed(refused: web.HTTPClientError, door: Door) -> web.HTTPClientError:
    """`refused`, its field named as the door's request names it (a 400 of `check_request`
    names Pigeon's `$.content.text`, which KumoMTA's request calls `$.content.text_body`)."""
    if not isinstance(refused, web.HTTPBadRequest) or not isinstance(refused.body, bytes):
        return refused
    try:
        error = msgspec.json.decode(refused.body, type=ErrorResponse)
    except msgspec.DecodeError:
        return refused
    if error.field is None or (field := door.field(error.field)) == error.field:
        return refused
    body = msgspec.json.encode(ErrorResponse(error.error, field))
    return web.HTTPBadRequest(body=body, content_type="application/json")


def _log_refusal(request: web.Request, refused: web.HTTPClientError, holder: str, session: str) -> None:
    node = request.app[NODE_KEY]
    body = refused.body
    try:
        if not isinstance(body, bytes | bytearray):
            raise TypeError("not a JSON error")
        error = msgspec.json.decode(body, type=ErrorResponse)
    except (msgspec.DecodeError, TypeError):
        if isinstance(refused, web.HTTPRequestEntityTooLarge):  # (its body's size: aiohttp's text)
            text, field = too_large_text(node.config.http.max_request_size), "$"
        else:
            text, field = refused.reason, None
    else:
        text, field = error.error, error.field
    node.intake.metrics.rejections.labels("inject", str(refused.status)).inc()
    body = request.get(_BODY)
    sender, recipients = _named(body, node.config.smtp.max_recipients) if body is not None else (None, None)
    node.intake.log.write(
        Rejection(
            timestamp=time.time(),
            session=session,
            peer=_peer(request)[1],
            command="inject",
            response=Response(refused.status, f"{text} ({field})" if field else text),
            sender=sender,
            recipients=recipients,
            auth_user=holder,
        )
    )


class _Named(msgspec.Struct):
    """The envelope a request refused whole names, read whatever else is wrong with it. (The
    members not named here are skipped, not decoded: a number too large to hold in the
    substitutions, which is why it was refused, leaves the envelope to be read.)"""

    envelope_sender: Any = None
    recipients: msgspec.Raw = msgspec.Raw(b"null")


class _NamedRecipient(msgspec.Struct):
    """A recipient of a request refused whole, its members other than `email` skipped."""

    email: Any = None


def _named(body: bytes, most: int) -> tuple[str | None, list[str] | None]:
    """The sender and (the first `most`: `[smtp] max_recipients`, as a refused DATA's record names
    at most) recipients a refused request's body names, escaped as SMTP's records escape them,
    so that `pigeon logs --sender` and `--recipient` find why an application's mail never came.
    None for what it does not name (a body that is no JSON names nothing)."""
    try:
        named = msgspec.json.decode(body, type=_Named)
    except (msgspec.DecodeError, RecursionError):  # (a ValidationError is a DecodeError)
        return None, None
    sender = shown(named.envelope_sender) if isinstance(named.envelope_sender, str) else None
    recipients: list[str] = []
    try:
        listed = msgspec.json.decode(named.recipients, type=list[msgspec.Raw])
    except msgspec.DecodeError:  # (no list: names none)
        listed = []
    for raw in listed:
        if len(recipients) >= most:
            break
        try:
            recipient = msgspec.json.decode(raw, type=_NamedRecipient)
        except (msgspec.DecodeError, RecursionError):  # (no object: names none)
            continue
        if isinstance(recipient.email, str):
            recipients.append(shown(recipient.email))
    return sender, recipients or None


async def _inject(
    request: web.Request, holder: str, session: str, tenants: frozenset[str] | None, door: Door
) -> web.Response:
    node = request.app[NODE_KEY]
    config = node.config
    require_json(request)
    max_size = config.http.max_request_size
    if declared_too_large(request, max_size):  # (left to this handler by the app's body limit)
        raise web.HTTPRequestEntityTooLarge(max_size=max_size, actual_size=request.content_length or 0)
    body = await read_body(request)  # (400 naming Content-Encoding for a body not coded as it says)
    if (crowded := too_many_values(body)) is not None:  # before anything decodes it
        raise bad_request(crowded, "$")
    if (repeated := repeated_member(body)) is not None:
        raise bad_request(repeated_refusal(repeated), repeated)
    request[_BODY] = body  # what a refusal's record reads the envelope from (`_named`)
    try:
        parsed = door.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError, ComposeError) as error:
        # Named as the client named it: the door's own path of a member it sent, not renamed
        # as Pigeon's (KumoMTA's `$.content.html`, which it does not take, is no `html_body`).
        raise _NamedAsSent(_refusal(body, error)) from None
    given = [recipient.email for recipient in parsed.recipients]  # (what each result names, in request order)
    # Each recipient's index in the request: the results, a repeat's `duplicate_of` and a
    # refusal's field name it by that, whatever a door refused alone before it (`_requested`).
    positions = list(range(len(given)))
    # (a door that refuses them alone: those its request named, by index, each with its refusal)
    not_addresses: dict[int, Reply] = {}
    try:
        if door.addresses_alone:
            kept: list[InjectRecipient] = []
            positions = []
            for position, recipient in enumerate(parsed.recipients):
                if (problem := recipient_problem(recipient.email)) is None:
                    kept.append(recipient)
                    positions.append(position)
                else:  # as SMTP's RCPT refuses it, in the text the other doors give
                    not_addresses[position] = replies.r(problem.kind.smtp_code, "5.1.3", problem.text)
            parsed.recipients = kept
        if len(given) > (limit := config.http.max_recipients):
            # One message per recipient: the request's work grows with them, not one envelope.
            text = f"{len(given)} recipients, over [http] max_recipients ({limit}): send them in more requests"
            raise bad_request(text, "$.recipients")
        for recipient in parsed.recipients:
            # As `RCPT TO:<postmaster>` is: one function says what names the postmaster, so
            # that every door delivers it alike, and a repeat of it is found as one.
            if address.is_postmaster(recipient.email, config.smtp.hostname):
                recipient.email = config.smtp.postmaster
        check_request(
            parsed, max_metadata_size=config.http.max_metadata_size, max_line_length=config.smtp.max_line_length
        )
    except ComposeError as error:
        raise bad_request(str(error), _requested(error.field, positions)) from None
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as error:
        raise _refusal(body, error) from None
    tenant_header, bound = config.delivery.tenant_header, tenants is not None
    composer = Composer(
        parsed,
        config.smtp.hostname,
        config.delivery.tenant_header,
        config.delivery.campaign_header,
        max_output=config.smtp.max_message_size,
        max_render_time=config.http.max_render_time,
        max_line_length=config.smtp.max_line_length,
    )
    try:
        composer.check_header_values()  # a line break a value would put into a header: 400
        composer.check_routing()  # a tenant or campaign both in the request and its content: 400
    except ComposeError as error:
        raise bad_request(str(error), _requested(error.field, positions)) from None
    if tenants is not None and parsed.tenant and parsed.tenant not in tenants:
        # Said at once, before any policy hook is asked: no recipient of it could be taken.
        reply = replies.r(550, "5.7.1", f"{holder} may not send as tenant {parsed.tenant}")
        raise forbidden(str(reply), "$.tenant")
    peer_ip, peer = _peer(request)
    arrival = Arrival("http", session, peer, peer_ip, "", "HTTP", auth_user=holder, trusted=True, tenants=tenants)
    sender = parsed.envelope_sender
    results = [RecipientResult(email) for email in given]  # in request order
    # Each message being stored, with the results of its recipients.
    pending: list[tuple[list[RecipientResult], Draft, asyncio.Future[Stored]]] = []
    # Raw content with nothing rendered per recipient is one message for them all: composed and
    # stored once, after every recipient is asked about, as SMTP stores one body for the
    # recipients of a transaction (not once per recipient: 25 MiB to 10,000 of them was 250 GB).
    shared = composer.shared
    sharing: list[tuple[RecipientResult, InjectRecipient]] = []
    max_stored = config.http.max_stored_size
    stored_size = 0  # the bytes of the messages this request has the spool store

    # What a refused recipient's Rejection can say of its message, known before any is composed:
    # the request's tenant (or its token's one tenant, which mail naming none is given) and
    # campaign, and the recipient's metadata (by `id` of its result: looked up, not searched).
    # A tenant or campaign its content's headers name is only known once rendered: not said.
    tenant = parsed.tenant or (next(iter(tenants)) if tenants is not None and len(tenants) == 1 else None)
    campaign = parsed.campaign or None
    metadata_of: dict[int, dict[str, str]] = {}
    # The tenants its mail may be of, as far as the request says before anything is composed
    # (`[[route]] tenants` refuses a recipient none of them may send to): the one it names or
    # its token's one; a token bound to several, one of them or none. Else (an unbound token,
    # no tenant named) its content's header may name any: the intake judges each message.
    possible: frozenset[str | None] | None = None
    if tenant is not None:
        possible = frozenset({tenant})
    elif tenants is not None:
        possible = frozenset({*tenants, None})

    def refuse(result: RecipientResult, reply: Reply, *, message_id: str | None = None) -> None:
        """Refuse one recipient: its error, its Rejection record, its count."""
        result.error = str(reply)
        node.intake.metrics.rejections.labels("inject", str(reply.code)).inc()
        node.intake.log.write(
            Rejection(
                timestamp=time.time(),
                session=session,
                peer=peer,
                command="inject",
                response=Response.of(reply),
                sender=shown(sender),  # (escaped as SMTP's records escape what a client sent)
                recipients=[shown(result.email)],
                auth_user=holder,
                id=message_id,
                tenant=tenant,
                campaign=campaign,
                meta=metadata_of.get(id(result)),
            )
        )

    # The SMTP hooks, filled as on_message is for HTTP (no HELO, no TLS, the token's name);
    # a policy without them builds nothing.
    policy = node.intake.policy
    on_mail_from, on_rcpt_to = policy.on_mail_from, policy.on_rcpt_to
    everyone: Reply | None = None  # on_mail_from's refusal: every recipient's answer
    if on_mail_from is not None:
        smtputf8 = not (sender.isascii() and all(r.email.isascii() for r in parsed.recipients))
        mail = objects.MailFrom(session, peer_ip, "", sender, None, smtputf8, None, holder, "http")
        verdict = await _settled(on_mail_from(mail, session=session))
        if verdict is not None:
            everyone = refusal(verdict)
    for position, reply in not_addresses.items():
        refuse(results[position], reply)
    taken: list[str] = []  # the recipients on_rcpt_to let through so far
    composing = False  # whether a recipient has been composed yet
    turn = time.monotonic()
    first_of: dict[str, int] = {}  # each mailbox's first index in the request
    for index, recipient in enumerate(parsed.recipients):
        position = positions[index]
        result = results[position]
        if recipient.metadata:
            metadata_of[id(result)] = recipient.metadata
        if time.monotonic() - turn > _YIELD_AFTER:
            await asyncio.sleep(0)
            turn = time.monotonic()
        # One request, one message per mailbox: a repeat would be delivered twice. Refused
        # before the policy is asked, so that its hooks see each mailbox once.
        first = first_of.setdefault(address.same_mailbox_key(recipient.email), position)
        if first != position:
            result.duplicate_of = first
            refuse(result, replies.r(550, "5.1.0", f"duplicate of recipient {first} of the request"))
            continue
        if everyone is not None:
            refuse(result, everyone)
            continue
        if (reserved := _reserved_refusal(node.intake, recipient.email, config.smtp.postmaster, possible)) is not None:
            refuse(result, reserved)
            continue
        if on_rcpt_to is not None:
            rcpt = objects.RcptTo(session, peer_ip, "", sender, recipient.email, tuple(taken), None, holder, "http")
            verdict = await _settled(on_rcpt_to(rcpt, session=session))
            if verdict is not None:
                refuse(result, refusal(verdict))
                continue
            taken.append(recipient.email)
        if shared:
            sharing.append((result, recipient))
            continue
        first_composed, composing = not composing, True
        try:
            composed = composer.compose(recipient)
        except RenderTimeSpent as error:
            refuse(result, replies.r(451, "4.3.0", f"{error}; send this recipient again"))
            continue
        except TemplateLimitError as error:
            if first_composed:  # nothing taken yet: refuse the request, naming the limit
                raise bad_request(
                    str(error), f"$.content.{error.field}" if error.field != "raw" else "$.content"
                ) from None
            refuse(result, replies.r(554, "5.6.0", str(error)))
            continue
        except ComposeError as error:
            refuse(result, replies.r(554, "5.6.0", str(error)))
            continue
        # What SMTP reception refuses, injection refuses too: the request was checked, but a
        # recipient's substitutions are only seen here, and the next hop must never get a
        # bare LF or CR it could take for the end of the data. Content not rendered per
        # recipient that fails the check is the request's fault: every recipient's message
        # would fail alike, so the request is refused whole (as is a second From), once; so is
        # a first message over the size, rendered or not (`_refuses_whole`).
        # The replies are SMTP reception's own (`replies`), word for word: one rule, one text.
        unfit = check_message(
            composed.data,
            max_size=config.smtp.max_message_size,
            max_line_length=config.smtp.max_line_length,
            uncounted=composed.own,  # (what Pigeon wrote itself: SMTP does not count its own either)
        )
        if unfit is not None:
            if first_composed and _refuses_whole(unfit, parsed, config):
                raise content_refused(unfit)
            refuse(result, unfit)
            continue
        if (repeated := repeated_field_in(composed.data)) is not None:
            # Two From (or Subject, ...) fields: the content's fault, whoever the recipient, so
            # the request is refused whole when the first one's message has them (the intake
            # would refuse each recipient's with 554 5.6.0 all the same).
            if first_composed:
                raise content_refused(replies.content_field_repeated(repeated))
            refuse(result, replies.content_field_repeated(repeated))
            continue
        # What the request has the spool store is bounded, whatever its own size: its first
        # message's size times the recipients from it on refuses it whole (nothing stored); a
        # later message its substitutions make larger is refused for now.
        size = len(composed.data)
        if first_composed and (total := size * (len(parsed.recipients) - index)) > max_stored:
            raise _stored_too_large(
                f"{len(parsed.recipients) - index} recipients' messages of {size} bytes would store {total} bytes",
                total,
                max_stored,
            )
        if stored_size + size > max_stored:
            refuse(result, _over_stored_size(max_stored))
            continue
        stored_size += size
        envelope = Envelope(
            sender,
            [Recipient(recipient.email)],
            smtputf8=composed.smtputf8,
            body="8BITMIME" if not composed.data.isascii() else None,
            peer=peer,
            auth_user=holder,
            protocol="HTTP",
            metadata=recipient.metadata or None,
        )
        draft = node.intake.draft(envelope, arrival)
        draft.write(composed.data)
        if first_composed and (whole := _refused_whole(draft, parsed, composed.data, bound, tenant_header)) is not None:
            draft.discard()
            raise whole
        # A client gone by the time its recipient's checks are done (a slow policy hook, DKIM
        # signing) never hears what was taken and will send the request again: as over SMTP,
        # what is not stored yet is not stored, and a commit it left during is logged unanswered.
        present = functools.partial(_present, request)
        committed = functools.partial(_committed, request, session)
        pending.append(([result], draft, draft.commit(committed, present=present)))
    if not composing and not sharing:
        # No recipient was left to compose a message for (each refused: not an address, by the
        # policy): the content is checked all the same, as it is with one taken, so that content
        # refused with a recipient is refused without one too, not answered 200 taking none.
        checked = parsed.recipients[0] if parsed.recipients else InjectRecipient(config.smtp.postmaster)
        _check_content_alone(composer, parsed, checked, functools.partial(node.intake.draft, arrival=arrival),
                             config, bound, tenant_header, peer, holder)  # fmt: skip
    if sharing:
        composed = composer.compose(sharing[0][1])  # (nothing rendered: the same for every recipient)
        unfit = _unfit_content(composed, parsed, config)
        # (a template without a `{` that fails the check: refused per recipient, as rendered ones are)
        messages = _shared_messages(sharing, config.smtp.max_recipients) if unfit is None else []
        if unfit is not None:
            for result, _ in sharing:
                refuse(result, unfit)
        if (total := len(composed.data) * len(messages)) > max_stored:
            text = f"{len(messages)} messages of {len(composed.data)} bytes would store {total} bytes"
            raise _stored_too_large(text, total, max_stored)
        for number, members in enumerate(messages):
            envelope = Envelope(
                sender,
                [Recipient(recipient.email) for _, recipient in members],
                smtputf8=composed.smtputf8,
                body="8BITMIME" if not composed.data.isascii() else None,
                peer=peer,
                auth_user=holder,
                protocol="HTTP",
                metadata=members[0][1].metadata or None,
            )
            draft = node.intake.draft(envelope, arrival)
            draft.write(composed.data)
            if (
                number == 0
                and (whole := _refused_whole(draft, parsed, composed.data, bound, tenant_header)) is not None
            ):
                draft.discard()  # (as for a composed first message: nothing is taken yet)
                raise whole
            present = functools.partial(_present, request)
            committed = functools.partial(_committed, request, session)
            pending.append(([result for result, _ in members], draft, draft.commit(committed, present=present)))
    for results_of, draft, future in pending:
        try:
            stored = await future
        except (Refused, SpoolError) as error:
            # Logged as SMTP logs a refused DATA, with the id the policy's on_message saw (and
            # a PolicyFailure names): the response carries no id for a refused recipient.
            if isinstance(error, ClientGone):
                _log.warning("session %s: client gone before message %s was stored: not stored (nothing was "
                             "accepted: it never got an answer)", session, format_id(draft.id))  # fmt: skip
            for result in results_of:
                refuse(result, error.reply, message_id=format_id(draft.id))
        else:
            # A recipient's id is that of its domain's message (one per domain, as over SMTP).
            ids = draft.ids_by_recipient() if len(stored.ids) > 1 else {}
            for result in results_of:
                result.id = format_id(ids.get(result.email, stored.ids[0]))
    accepted = sum(1 for r in results if r.id is not None)
    response = InjectResponse(accepted, len(results) - accepted, results)
    # Nothing stored because the spool failed: the client should come back later.
    spool_trouble = accepted == 0 and any(r.error and r.error.startswith("4") for r in results)
    if spool_trouble:
        return door.answer(response, 503)
    # Every one of them refused for good (by the policy, a template, the size...): the request
    # itself cannot be carried out, and a client that looks only at the status must see it.
    everyone_refused = accepted == 0 and bool(results)
    return door.answer(response, 422 if everyone_refused else 200)


def _reserved_refusal(
    intake: Intake, email: str, postmaster: str, possible: frozenset[str | None] | None
) -> Reply | None:
    """550 5.7.1 for a recipient whose domain's `[[route]]` is reserved for other tenants than
    any of `possible` (what its mail may be of; None: not known before it is composed), as
    SMTP refuses its RCPT. The postmaster and an `[[inbound]]` route's recipients go by no route."""
    reserved = intake.route_tenants
    if possible is None or not reserved.any or email == postmaster:
        return None
    if intake.inbound_routes is not None and intake.inbound_routes.target(email) is not None:
        return None
    return reserved.refusal(Recipient(email).domain, possible)


def _check_content_alone(
    composer: Composer,
    parsed: InjectRequest,
    recipient: InjectRecipient,
    draft_of: Callable[[Envelope], Draft],
    config: Config,
    bound: bool,
    tenant_header: str,
    peer: str,
    holder: str,
) -> None:
    """Refuse the request (400, 403) for content that would refuse it whole with a recipient
    taken, when none was: composed for `recipient` (its first, else a stand-in), checked as a
    first message is, and not stored. A rendering that fails for that recipient says nothing of
    the content: left alone, as a later recipient's would be."""
    try:
        composed = composer.compose(recipient)
    except TemplateLimitError as error:
        raise bad_request(str(error), f"$.content.{error.field}" if error.field != "raw" else "$.content") from None
    except ComposeError:
        return
    _unfit_content(composed, parsed, config)
    envelope = Envelope(
        parsed.envelope_sender,
        [Recipient(recipient.email)],
        smtputf8=composed.smtputf8,
        body="8BITMIME" if not composed.data.isascii() else None,
        peer=peer,
        auth_user=holder,
        protocol="HTTP",
    )
    draft = draft_of(envelope)
    try:
        draft.write(composed.data)
        if (whole := _refused_whole(draft, parsed, composed.data, bound, tenant_header)) is not None:
            raise whole
    finally:
        draft.discard()


def _unfit_content(composed: Composed, parsed: InjectRequest, config: Config) -> Reply | None:
    """Why `composed` cannot be stored as SMTP reception would refuse it (`check_message`), or
    None. Content refused whole (`_refuses_whole`: not a template's, or over the size; and any
    with a header field given twice) is refused here, for the whole request (400); a template's
    otherwise unfit rendering is returned, to be refused per recipient, as a rendering for each is."""
    unfit = check_message(
        composed.data,
        max_size=config.smtp.max_message_size,
        max_line_length=config.smtp.max_line_length,
        uncounted=composed.own,
    )
    if unfit is not None and _refuses_whole(unfit, parsed, config):
        raise content_refused(unfit)
    if (repeated := repeated_field_in(composed.data)) is not None:
        raise content_refused(replies.content_field_repeated(repeated))
    return unfit


def _refuses_whole(unfit: Reply, parsed: InjectRequest, config: Config) -> bool:
    """Whether the first recipient's message failing the content check with `unfit` refuses the
    request whole (400 naming `$.content`, with SMTP's reply): content sent as it is (not a
    template) fails it for every recipient; and a message over `[smtp] max_message_size` is
    refused so whatever `template` says, as a render whose output passes that size is (a
    render budget, `TemplateLimitError`): the same content gets the same answer, rendered or
    not. A later recipient's is refused alone, as its substitutions may be what made it so."""
    return not parsed.template or unfit == replies.message_too_big(config.smtp.max_message_size)


def _shared_messages(
    sharing: list[tuple[RecipientResult, InjectRecipient]], per_message: int
) -> list[list[tuple[RecipientResult, InjectRecipient]]]:
    """The messages that shared content makes: one for the recipients with the same metadata
    (it is the message's: its log records carry it), at most `per_message` (`[smtp]
    max_recipients`) recipients each, as an SMTP transaction holds; the intake then stores
    one spool message per domain of each, all sharing its body."""
    alike: dict[tuple[tuple[str, str], ...], list[tuple[RecipientResult, InjectRecipient]]] = {}
    for member in sharing:
        alike.setdefault(tuple(sorted(member[1].metadata.items())), []).append(member)
    return [group[at : at + per_message] for group in alike.values() for at in range(0, len(group), per_message)]


def _stored_too_large(what: str, total: int, limit: int) -> web.HTTPRequestEntityTooLarge:
    """413 for a request that would have the spool store more than `[http] max_stored_size`."""
    text = f"{what}, over [http] max_stored_size ({limit} bytes): send the recipients in smaller requests"
    body = msgspec.json.encode(ErrorResponse(text, "$.recipients"))
    return web.HTTPRequestEntityTooLarge(limit, total, text=None, body=body, content_type="application/json")


def _over_stored_size(limit: int) -> Reply:
    """A recipient whose message would take the request past `[http] max_stored_size`."""
    text = f"The request's messages would pass [http] max_stored_size ({limit} bytes): send this recipient again"
    return replies.r(452, "4.3.1", text)


def _present(request: web.Request) -> bool:
    """Whether the client of `request` can still be answered (its close, or its half-close,
    closes the transport)."""
    return request.transport is not None


def _committed(request: web.Request, session: str, future: asyncio.Future[Stored]) -> None:
    """A recipient's commit ended: with the client gone meanwhile, say what became of its
    message, as the draft found it (its Reception says `answered: false`)."""
    if not future.cancelled() and future.exception() is None and not _present(request):
        ids = " ".join(format_id(spool_id) for spool_id in future.result().ids)
        _log.warning("session %s: client gone during the commit: message %s is stored and kept, but its answer "
                     "could not be given (the client may send it again)", session, ids)  # fmt: skip


async def _settled(verdict: Verdict[Refuse] | asyncio.Future[Verdict[Refuse]]) -> Refuse | HookFailed | None:
    """A hook's answer, once it has one (an async or threaded hook's is awaited); a call that
    ended in an error (a hook's own failures are verdicts: a bug of ours) counts as failed."""
    if isinstance(verdict, asyncio.Future):
        try:
            return await verdict
        except Exception as error:
            _log.error("a policy hook's call failed unexpectedly: %s", error, exc_info=error)
            return HookFailed(POLICY_ERROR)
    return verdict


def forbidden(error: str, field: str) -> web.HTTPForbidden:
    """403 with a JSON body naming the field: what the token may not do."""
    body = msgspec.json.encode(ErrorResponse(error, field))
    return web.HTTPForbidden(body=body, content_type="application/json")


def _refused_whole(
    draft: Draft, parsed: InjectRequest, data: bytes, bound: bool, tenant_header: str
) -> web.HTTPBadRequest | web.HTTPForbidden | None:
    """What refuses the request whole for its first message (`draft`, of `data`): nothing is
    taken yet, and the trouble is the request's, so it is said once, naming where in the
    request it is (a part's header, as given, or `$.content`), not per recipient. Asked in the
    order SMTP reception asks (`Draft.content_refusal`): a tenant or campaign header that
    cannot name a queue (400: it names no tenant, so none the token may not name), then a
    tenant the token (`bound`) may not name (403); then the rest of the content check when
    the content is every recipient's alike, or has no From, or a Date or Message-ID that is
    not one (a template's first message: the content's fault too)."""
    if (routing := draft.routing_refusal()) is not None:
        header, reply = routing
        return bad_request(str(reply), _content_field(parsed, header))
    if bound and (binding := draft.binding_refusal()) is not None:
        return forbidden(str(binding), "$.tenant" if parsed.tenant else _content_field(parsed, tenant_header))
    malformed = malformed_field_in(data)
    whole = not parsed.template or author_missing_in(data) or malformed is not None
    if whole and (unfit := draft.content_refusal()) is not None:
        # Its header section (a loop's Received fields, no From, a Date that is no date): the
        # same for every recipient.
        return bad_request(str(unfit), _content_field(parsed, malformed.name) if malformed else "$.content")
    return None


def _content_field(parsed: InjectRequest, header: str) -> str:
    """Where in the request's content a header field was given: a part's `headers` member,
    named as given (`$.content.headers.x-tenant`), or `$.content` (raw content, or a field
    Pigeon wrote)."""
    content = parsed.content
    if not isinstance(content, str):
        for name in content.headers:
            if name.lower() == header.lower():
                return f"$.content.headers.{name}"
    return "$.content"


def content_refused(reply: Reply) -> web.HTTPBadRequest:
    """400 for content that fails reception's content check, with the reply SMTP would give."""
    return bad_request(str(reply), "$.content")


def bad_request(error: Exception | str, field: str | None = None) -> web.HTTPBadRequest:
    """400 with a JSON body naming the field (msgspec's messages end with its path)."""
    message = str(error)
    key = False
    if field is None and (match := _FIELD.search(message)) is not None:
        key, field, message = bool(match.group(1)), match.group(2), message[: match.start()]
    if "matching regex" in message:  # the schema's pattern is no help to a person: say what it means
        is_address = field is not None and field.endswith((".email", "envelope_sender"))
        if key and field is not None and field.endswith(".headers"):
            message = "A header field name is printable ASCII, without a colon or a space (RFC 5322 2.2)"
        elif key:
            message = "A name in it is not of the required form"
        else:
            message = "Not a valid mailbox address (local@domain)" if is_address else "Not of the required form"
    body = msgspec.json.encode(ErrorResponse(message, field))
    return web.HTTPBadRequest(body=body, content_type="application/json")


_ADDRESS_FIELD: Final = re.compile(
    r"\$\.(?:envelope_sender|recipients\[\d+\]\.email|content\.(?:from|reply_to)\.email)"
)
_MEDIA_TYPE_FIELD: Final = re.compile(r"\$\.content\.attachments\[\d+\]\.content_type")


_MEMBER: Final = re.compile(r"(Object (?:contains unknown|missing required) field `([^`]*)`)(?: - at `(\$[^`]*)`)?")
_MAP_VALUE: Final = re.compile(r"(.*) - at `(\$[^`]*)\[\.\.\.\]`")


def _refusal(
    body: bytes, error: msgspec.ValidationError | msgspec.DecodeError | RecursionError | ComposeError
) -> web.HTTPBadRequest:
    """400 for a request that could not be read or checked, naming the member at fault."""
    if isinstance(error, msgspec.ValidationError):
        try:  # (msgspec validates as it parses: `{"a":` was "unknown field `a`", cut off as it is)
            msgspec.json.decode(body)
        except msgspec.ValidationError:
            # A number too large to hold ("Number out of range": a DecodeError too), where the
            # check stopped: JSON so far. (Refused as malformed, this was refused again and
            # again, to a RecursionError and a 500.)
            pass
        except msgspec.DecodeError as malformed:
            return _refusal(body, malformed)
        except RecursionError:
            pass
        if (number := number_out_of_range(body, str(error))) is not None:
            return bad_request(out_of_range_text(), number)
        if (refused := _value_refusal(body, str(error))) is not None:
            return refused
        return _member_refusal(body, str(error))
    if isinstance(error, msgspec.DecodeError):
        if (surrogate := lone_surrogate(body)) is not None:  # msgspec says "truncated", naming no member
            path, name = surrogate
            return bad_request(lone_surrogate_refusal(path, name=name), path)
        return bad_request(f"malformed JSON: {error}", "$")
    if isinstance(error, RecursionError):
        # msgspec builds `substitutions` and `metadata` values with one C stack frame per
        # level and stops at Python's recursion limit; before, this was a 500 and a traceback.
        return bad_request("JSON nested too deeply (about 1000 levels at most)", "$")
    return bad_request(str(error), error.field)


_RECIPIENT_AT: Final = re.compile(r"\$\.recipients\[(\d+)\]")


def _requested(field: str, positions: list[int]) -> str:
    """`field`, a recipient it names by its index among those checked (`positions`: each one's
    index in the request) named by its index in the request, as the client counts them: a
    door that refuses a recipient alone (`Door.addresses_alone`) left it out of those."""
    return _RECIPIENT_AT.sub(lambda found: f"$.recipients[{positions[int(found.group(1))]}]", field, count=1)


class _NamedAsSent(Exception):
    """A refusal whose field is named as the door's request names it already: not renamed."""

    def __init__(self, refusal: web.HTTPBadRequest) -> None:
        super().__init__(refusal.text)
        self.refusal = refusal


def _member_refusal(body: bytes, error: str) -> web.HTTPBadRequest:
    """400 naming the member at fault by its JSON path, as the admin API does: an unknown or
    missing member (`$.colour`, `$.envelope_sender`), a map's value that is no string by its
    key (`$.recipients[0].metadata.u`), where msgspec says only the object it is in, or `[...]`."""
    if (member := _MEMBER.fullmatch(error)) is not None:
        text, name, at = member.groups()
        return bad_request(text, member_path(at or "$", name))
    if (value := _MAP_VALUE.fullmatch(error)) is not None:
        text, at = value.groups()
        if (key := _first_not_a_string(body, at)) is not None:
            return bad_request(text, member_path(at, key))
    return bad_request(error, None if _FIELD.search(error) else "$")


def _first_not_a_string(body: bytes, path: str) -> str | None:
    """The name of the first member of the object at `path` in `body` whose value is no string."""
    span = span_at(body, path)
    if span is None:
        return None
    try:
        return next((name for name, start, _ in members(body, span[0]) if body[start : start + 1] != b'"'), None)
    except (ValueError, IndexError):
        return None


def _value_refusal(body: bytes, error: str) -> web.HTTPBadRequest | None:
    """400 for a value the request's schema refused by its pattern, saying what is wrong with
    it rather than "does not match the pattern": for an address, the text `pigeon.smtp.address`
    gives (what SMTP says of the same address); for an attachment's content type, what a media
    type is (or the character it must not hold)."""
    match = _FIELD.search(error)
    if match is None or match.group(1):
        return None
    field = match.group(2)
    media_type = _MEDIA_TYPE_FIELD.fullmatch(field) is not None
    if not media_type and not _ADDRESS_FIELD.fullmatch(field):
        return None
    # Found by scanning, not decoding the body: beside a value nested past Python's recursion
    # limit (`metadata`), decoding raised RecursionError here, and the answer was a 500.
    span = span_at(body, field)
    if span is None or body[span[0] : span[0] + 1] != b'"':
        return None
    value = json.loads(body[span[0] : span[1]])
    if media_type:
        return bad_request(media_type_problem(value), field)
    if field == "$.envelope_sender" and value == "":
        return None
    problem = address.check(value)
    return bad_request(problem.text if problem is not None else address.SYNTAX_TEXT, field)


def _peer(request: web.Request) -> tuple[str, str]:
    transport = request.transport
    peername: Any = transport.get_extra_info("peername") if transport is not None else None
    if isinstance(peername, tuple):
        return str(peername[0]), f"{peername[0]}:{peername[1]}"
    # A worker's unix socket, which only the supervisor can reach: it names the client.
    forwarded = request.headers.get(FORWARDED_PEER, "")
    host = forwarded.rpartition(":")[0]
    return (host, forwarded) if host else ("127.0.0.1", "local")


def _json(value: msgspec.Struct, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(value), status=status, content_type="application/json")
