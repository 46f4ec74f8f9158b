"""HTTP webhook: one POST per message; 2xx accepted, configured 4xx permanent, the rest later.

The body is the raw message (`message/rfc822`) or JSON with the parsed headers and the raw
message. `X-Pigeon-Dedupe-Key` is the key to dedupe on. Raw mail received over SMTP also carries
its envelope, which the message need not show (a Bcc): `X-Pigeon-Sender`, `X-Pigeon-Recipients`
(a comma-separated list, each address percent-encoded as UTF-8 but for `HEADER_SAFE`, cut at
4,000 characters) and `X-Pigeon-Recipients-Count`; mail fetched from a mailbox, and a JSON body
(which holds the envelope itself), go without them.

With a secret, `X-Pigeon-Signature: t=<unix time>,v1=<hex>,v2=<hex>` lets the application check
the request came from us and is fresh (refuse an old `t`: a replay), both HMAC-SHA256 with the
secret, in lower-case hex:

- `v1` over `"<t>." + body`: the body only. Anyone who saw one request (a log, a proxy) can send
  it again within the freshness window with other `X-Pigeon-Recipients` (filed to another
  mailbox by an application that routes by recipient) or another `X-Pigeon-Dedupe-Key` (past the
  application's dedupe). Kept for the verifiers written for it.
- `v2` over `signed_string`: `<t>` and a line feed; then, for each of `SIGNED_HEADERS` in that
  order that the request has, its name in lower case, ":", its value as sent (no white space
  added around the ":") and a line feed, an absent one leaving no line; then a line feed (an
  empty line); then the body. For raw mail over SMTP, these lines (each ending in a line feed,
  the empty one too) and the body:

      1700000000
      x-pigeon-dedupe-key:3a7b...
      x-pigeon-sender:ann@example.com
      x-pigeon-recipients:a1@hook.example, a2@hook.example
      x-pigeon-recipients-count:2

  and for mail from a mailbox, or a JSON body, the first two and the empty one. No two header
  sets (or bodies) give the same string: `<t>` is digits; each header line starts with its own
  name, in a fixed order, and no value holds a line break (Pigeon's are ASCII without
  controls: hex, digits, addresses percent-encoded but for `HEADER_SAFE`); the headers' part
  ends at the first empty line, which no header line is. So an added, dropped or altered signed
  header breaks `v2`, as an altered body or `t` does (an empty X-Pigeon-Sender, mail from `<>`,
  is a line "x-pigeon-sender:", not an absent one). `X-Pigeon-Source` and `X-Pigeon-Message-Id`
  are not signed. `v1`'s string has "." after `<t>` where `v2`'s has a line feed, so neither
  MAC stands for the other. A verifier checks `v2` (one that checks `v1` alone can be fooled as
  above) and reads the headers as the application will (README: "Verifying a webhook request").

The status line is the answer: a 2xx is accepted whatever becomes of its body. What follows it
is read for a moment only (`_drain`), so a body that never ends (a `Content-Length` the server
does not fulfil, a connection left open) cannot turn an accepted handoff into "no answer", and
the message would be handed over again and again. So is a status line that came whole (its
line end too) on a connection then closed, or reset (a TCP RST), before the headers end
(`_Recorder`): aiohttp calls the one a `ServerDisconnectedError` whose partial answer cannot
tell a whole status line from one cut short (both have the code), and the other a
`ClientOSError` that keeps nothing of it, so the bytes that came are kept to tell.

A 429 or 503 with `Retry-After` (seconds, or an HTTP-date: RFC 9110 10.2.3) is retried no
sooner than it asks, and no later than the retry schedule's longest wait (`Handoff.retry_after`).

The timeout counts this node's running time (`_within`): a node that was not running (SIGSTOP,
a stalled event loop) wakes with its timer overdue and the answer that came meanwhile still
unread in the socket, and a plain timer would fire first and call a 200 "no answer" (the
message then handed over again). A timer that fires that late gives the request the time the
node lost back instead; a request that still gets no answer says how long the node was stalled.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import email.utils
import functools
import hashlib
import hmac
import os
import ssl
import time
import urllib.parse
import weakref
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import aiohttp
import msgspec
from aiohttp.client_proto import ResponseHandler

from pigeon.config.schema import WebhookTarget as WebhookConfig
from pigeon.inbound.headers import header_fields
from pigeon.inbound.message import InboundMessage, header_block
from pigeon.inbound.targets.base import Handoff, Target, Verdict
from pigeon.redaction import redact, redact_url
from pigeon.tls import client_context

_encode = msgspec.json.Encoder().encode


_MAX_RECIPIENTS_HEADER: Final = 4000  # common servers refuse a header line over 8 KiB with a 400
_ASKS_TO_WAIT: Final = frozenset({429, 503})  # the answers whose Retry-After we follow (RFC 6585 4, RFC 9110 15.6.4)
_DRAIN_SECONDS: Final = 1.0  # what an answer's body may take once its status line came ...
_DRAIN_BYTES: Final = 64 * 1024  # ... and how much of it is read (an application says little)
_STALLED: Final = 0.5  # seconds a timer fires late by when the node was not running meanwhile
_HEAD_KEPT: Final = 8 * 1024  # bytes of an answer kept to find its status line (aiohttp's longest line)

_T = TypeVar("_T")


class _NoAnswer(TimeoutError):
    """The request had its time and got no answer; `stalled`: seconds of that time, given
    back, that the node itself was not running; `head`: the start of the answer that came on
    its connection, if any (`_Recorder`)."""

    def __init__(self, stalled: float, recorder: _Recorder | None = None) -> None:
        super().__init__()
        self.stalled = stalled
        self.head = bytes(recorder.head) if recorder is not None else b""


# The connection protocol of each request under way, by the task that sends it: a request that
# runs out of time after its status line came whole has had its answer (`_NoAnswer.head`).
_heads: weakref.WeakKeyDictionary[asyncio.Task[Any], _Recorder] = weakref.WeakKeyDictionary()


async def _within(seconds: float, request: Coroutine[Any, Any, _T]) -> _T:
    """`request`'s result, if it comes within `seconds` of this node's running time; raises
    `_NoAnswer` otherwise (the request cancelled)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(request)
    deadline = loop.time() + seconds
    stalled = 0.0
    try:
        while True:
            # (asyncio.wait, not a timeout around the request: when both are due in one turn
            # of the loop, the answer is looked at before the request is cancelled.)
            done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()))
            if done:
                return task.result()
            late = loop.time() - deadline
            if late < _STALLED:
                raise _NoAnswer(stalled, _heads.get(task))
            # Woken this late, the node was not running: an answer that came meanwhile waits
            # unread in the socket. The request gets the time back.
            stalled += late
            deadline = loop.time() + late
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})


def retry_after(value: str | None, now: float) -> float | None:
    """The seconds a `Retry-After` value asks for (RFC 9110 10.2.3: delay-seconds, or an
    HTTP-date, which is UTC); None when there is none or it is neither."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)  # (a number too long for a float is inf: capped by the caller)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - now)


def _envelope_headers(sender: str, recipients: Sequence[str]) -> dict[str, str]:
    """X-Pigeon-Sender, X-Pigeon-Recipients (as many as fit in 4,000 characters: a longer line
    would get a 400, which counts as a refusal for good) and X-Pigeon-Recipients-Count."""
    listed: list[str] = []
    length = 0
    for recipient in recipients:
        address = _header_address(recipient)
        length += len(address) + 2
        if length > _MAX_RECIPIENTS_HEADER:
            break
        listed.append(address)
    return {
        "X-Pigeon-Sender": _header_address(sender),
        "X-Pigeon-Recipients": ", ".join(listed),
        "X-Pigeon-Recipients-Count": str(len(recipients)),
    }


HEADER_SAFE: Final = "@!#$&'*+-/=?^_`{|}~."
"""What an address keeps as it is in X-Pigeon-Sender and X-Pigeon-Recipients, besides ASCII
letters and digits: the characters of a dot-atom local part (RFC 5321 4.1.2) and "@". All else
is percent-encoded as UTF-8: non-ASCII (SMTPUTF8), and the characters of a quoted local part that
would break the value or the list, or its decoding (`"`, space, ",", "%", controls). A consumer
splits the list on ", " and percent-decodes each address (`urllib.parse.unquote`)."""


def _header_address(address: str) -> str:
    """An address as an HTTP header value: percent-encoded but for `HEADER_SAFE`."""
    return urllib.parse.quote(address, safe=HEADER_SAFE)


SIGNED_HEADERS: Final = ("X-Pigeon-Dedupe-Key", "X-Pigeon-Sender", "X-Pigeon-Recipients", "X-Pigeon-Recipients-Count")
"""The request headers `v2` of X-Pigeon-Signature covers, in the order `signed_string` takes them."""


def signed_head(timestamp: int, headers: dict[str, str]) -> bytes:
    """What `v2` signs before the body (`signed_string` without it): `<t>`, a line per
    `SIGNED_HEADERS` name in `headers` ("<name in lower case>:<value>"), an empty line."""
    lines = [f"{name.lower()}:{headers[name]}\n" for name in SIGNED_HEADERS if name in headers]
    return f"{timestamp}\n{''.join(lines)}\n".encode()


def signed_string(timestamp: int, headers: dict[str, str], body: bytes) -> bytes:
    """What `v2` of X-Pigeon-Signature is the HMAC of (the module's docstring says it whole)."""
    return signed_head(timestamp, headers) + body


def signature(secret: str, timestamp: int, body: bytes, headers: dict[str, str] | None = None) -> str:
    """The X-Pigeon-Signature value for a body sent at `timestamp`: `v1` (the body's), and with
    the request's `headers` `v2` too (theirs in `SIGNED_HEADERS` and the body's)."""
    key = secret.encode()
    # (update() with the body, not a concatenation: no copy of a message of megabytes)
    v1 = hmac.new(key, f"{timestamp}.".encode(), hashlib.sha256)
    v1.update(body)
    if headers is None:
        return f"t={timestamp},v1={v1.hexdigest()}"
    v2 = hmac.new(key, signed_head(timestamp, headers), hashlib.sha256)
    v2.update(body)
    return f"t={timestamp},v1={v1.hexdigest()},v2={v2.hexdigest()}"


def _cannot_connect(error: aiohttp.ClientConnectorError) -> str:
    """`cannot connect to host:port: why`, as the SMTP client says it. aiohttp's own text
    ("Cannot connect to host h:p ssl:default [Connect call failed ('h', p)]") names its TLS
    setting even for plain http, and the address twice."""
    cause = error.os_error
    if isinstance(cause, ssl.SSLCertVerificationError):
        why = f"TLS: certificate not trusted: {cause.verify_message or cause.reason}"
    elif isinstance(cause, ssl.SSLError):
        why = f"TLS: {cause.reason.replace('_', ' ').lower() if cause.reason else cause}"  # "wrong version number"
    elif cause.errno is not None and cause.errno > 0:
        why = os.strerror(cause.errno)  # "Connection refused", not "Connect call failed (...)"
    else:  # a resolver's error (a negative errno) says itself
        why = cause.strerror or str(cause) or type(cause).__name__
    host = f"[{error.host}]" if ":" in error.host else error.host
    return f"cannot connect to {host}:{error.port}: {redact(why)}"


class _CutOff(aiohttp.ServerDisconnectedError):
    """The connection closed (`then`: "closed", or "was reset" by a TCP RST) before the
    answer's head ended. `status_line`: the answer's status line (no line end) when it came
    whole, else None; `came`: what came of the answer's head; `head`: the bytes that came."""

    def __init__(self, message: Any, head: bytes, then: str) -> None:
        super().__init__(message)
        self.status_line, self.came = _status_line(head)
        self.head = head
        self.then = then


class _Recorder(ResponseHandler):
    """aiohttp's protocol of a connection, keeping the first bytes of each answer (reset as a
    request starts: aiohttp sends one request at a time on a connection), so that a close
    before the head's end says whether its status line had come whole (`_CutOff`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head = bytearray()

    @property
    def head(self) -> bytearray:
        """What came of the current answer's start."""
        return self._head

    def set_response_params(self, *args: Any, **kwargs: Any) -> None:
        self._head.clear()  # (called for each request, before it is sent, by its task)
        task = asyncio.current_task()
        if task is not None:
            _heads[task] = self
        super().set_response_params(*args, **kwargs)

    def data_received(self, data: bytes) -> None:
        if len(self._head) < _HEAD_KEPT:
            self._head += data[: _HEAD_KEPT - len(self._head)]
        super().data_received(data)

    def set_exception(self, exc: BaseException, *args: Any, **kwargs: Any) -> None:
        if type(exc) is aiohttp.ServerDisconnectedError:
            exc = _CutOff(exc.message, bytes(self._head), "closed")
        elif (
            type(exc) is aiohttp.ClientOSError and self._head and isinstance(_cause(args, kwargs), ConnectionResetError)
        ):
            # A reset (an RST: a server closing with SO_LINGER 0) is a close too: what came
            # before it says as much as what came before a clean close.
            exc = _CutOff(None, bytes(self._head), "was reset")
        super().set_exception(exc, *args, **kwargs)


def _cause(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    """The underlying error aiohttp gives `set_exception` with its own (`exc_cause`)."""
    return args[0] if args else kwargs.get("exc_cause")


def _status_line(head: bytes) -> tuple[bytes | None, bytes]:
    """(the status line of the answer `head` begins, when its line end came, else None; what
    came of the line). The last line that starts "HTTP/" is the answer's (an interim 1xx answer
    may come before it); a header line cannot start so ("/" is not in a field name)."""
    *whole, rest = head.split(b"\n")
    if rest.startswith(b"HTTP/") or not whole:
        return None, rest
    lines = [line.rstrip(b"\r") for line in whole if line.startswith(b"HTTP/")]
    return (lines[-1], lines[-1]) if lines else (None, rest)


class _Connector(aiohttp.TCPConnector):
    """A connector whose connections keep the start of each answer (`_Recorder`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # (aiohttp's own attribute, the protocol of every new connection: a `_Recorder` is one)
        self._factory = cast("functools.partial[ResponseHandler]", functools.partial(_Recorder, loop=self._loop))


_SAID_AT_MOST: Final = 200  # characters of a broken answer said back in a handoff's detail


def _failed(error: aiohttp.ClientError | OSError) -> str:
    """A request's failure in plain words, on one line. A connection closed part way through the answer's
    head is a `ServerDisconnectedError` whose `message` is what aiohttp's parser made of the
    part that came (a `RawResponseMessage`), which its text gives as a repr
    ("<RawResponseMessage(version=HttpVersion(major=1, minor=1), code=2, ...)>"): said as the
    status line it read instead."""
    if isinstance(error, aiohttp.ClientResponseError):  # (raised by the parser: we raise no status)
        # "Bad status line:\n  Invalid response status:\n\n  b'HTTP/1.1 2000 OK'\n      ^", without
        # the caret line and the request's URL, which its text adds ("400, message=..., url=...").
        words = " ".join(line for line in error.message.splitlines() if line.strip(" ^~")).split()
        return _at_most(f"bad HTTP response: {redact(' '.join(words))}")
    if isinstance(error, _CutOff) and error.came:  # (a status line cut short: a whole one is an answer)
        came = error.came.rstrip(b"\r").decode("latin-1")
        reset = " (the connection was reset)" if error.then == "was reset" else ""
        return f'bad HTTP response: cut off after "{redact(_at_most(came))}"{reset}'
    if not isinstance(error, aiohttp.ServerDisconnectedError) or isinstance(error.message, str | None):
        return redact(str(error)) or type(error).__name__  # ("Server disconnected": nothing came)
    partial = error.message
    line = f"HTTP/{partial.version.major}.{partial.version.minor} {partial.code} {partial.reason or ''}".strip()
    fields = len(partial.headers)
    after = f" and {fields} header field{'s' if fields != 1 else ''}" if fields else ""
    return f'bad HTTP response: cut off after "{redact(_at_most(line))}"{after}'


def _at_most(text: str) -> str:
    """`text`, cut to `_SAID_AT_MOST` characters: what a server sent, said back in a detail."""
    return text if len(text) <= _SAID_AT_MOST else f"{text[: _SAID_AT_MOST - 3]}..."


async def _drain(response: aiohttp.ClientResponse) -> None:
    """Read the rest of an answer (its body), for a moment at most: read whole, its connection
    goes back to the pool for the next request. A body that does not end within
    `_DRAIN_SECONDS` (or is longer than `_DRAIN_BYTES`, or breaks off) changes nothing about
    the answer, which the status line gave: the connection is closed instead."""
    read = 0
    try:
        async with asyncio.timeout(_DRAIN_SECONDS):
            while read <= _DRAIN_BYTES:
                chunk = await response.content.readany()
                if not chunk:
                    return
                read += len(chunk)
    except (TimeoutError, aiohttp.ClientError, OSError):
        pass
    response.close()


def json_body(message: InboundMessage) -> bytes:
    fields = header_fields(header_block(message.raw))
    payload: dict[str, Any] = message.metadata(fields)
    payload["headers"] = fields
    try:
        payload["raw"] = message.raw.decode("utf-8")
    except UnicodeDecodeError:
        payload["raw"] = base64.b64encode(message.raw).decode("ascii")
        payload["raw_encoding"] = "base64"
    return _encode(payload)


def _tls_context(config: WebhookConfig) -> ssl.SSLContext | None:
    return tls_context(config.url, verify=config.tls_verify, ca_file=config.ca_file)


def tls_context(url: str, *, verify: bool, ca_file: Path | None) -> ssl.SSLContext | None:
    """The client context of an "https://" URL's connections, made once for the target (a
    `ca_file` read here, not at each request): TLS 1.2 or newer, the certificate checked
    against `ca_file` or the system's CAs unless `verify` is false. None for "http://"."""
    if urllib.parse.urlsplit(url).scheme.lower() != "https":
        return None
    context = client_context(verify=verify, cafile=ca_file)
    context.set_alpn_protocols(("http/1.1",))  # as aiohttp's own context says
    return context


def http_session(tls: ssl.SSLContext | None) -> aiohttp.ClientSession:
    """A session for `exchange`: no timeout of aiohttp's own (`_within` times each request),
    connections that keep the start of each answer (`_Recorder`)."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(),
        connector=_Connector(limit=64, ssl=tls if tls is not None else True),
    )


class Unanswered(Exception):
    """A POST got no answer to go by: no connection, no answer in time, a broken one. `detail`
    says which, with the URL (its secrets masked)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


async def exchange(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], within: float
) -> tuple[int, str, float | None]:
    """POST `body`, taking at most `within` seconds of this node's running time: (status,
    reason, seconds a Retry-After asks for) of its answer, a status line that came whole
    counting as one. Raises `Unanswered` when there is none to go by, and ValueError for a
    header aiohttp will not send."""
    try:
        return await _within(within, _post(session, url, body, headers))
    except TimeoutError as error:  # `_NoAnswer`, or a timeout of the connection's own
        status_line = _status_line(error.head)[0] if isinstance(error, _NoAnswer) else None
        if status_line is not None and (answer := _status_answer(status_line, "stalled")) is not None:
            # A status line that came whole is the answer, whatever stalled after it (a 2xx
            # taken for "no answer" would be sent again at every retry).
            return answer
        detail = f"no answer from {redact_url(url)} within {within:g}s"
        if isinstance(error, _NoAnswer) and error.stalled:
            detail += f" (not counting {error.stalled:.1f}s this node was not running)"
        raise Unanswered(detail) from None
    except aiohttp.ClientConnectorError as error:
        raise Unanswered(f"{redact_url(url)}: {_cannot_connect(error)}") from None
    except (aiohttp.ClientError, OSError) as error:
        raise Unanswered(f"{redact_url(url)}: {_failed(error)}") from None


async def _post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> tuple[int, str, float | None]:
    """(status, reason, seconds a Retry-After asks for) of one POST."""
    try:
        async with session.post(url, data=body, headers=headers, allow_redirects=False) as response:
            status = response.status
            asked = response.headers.get("Retry-After") if status in _ASKS_TO_WAIT else None
            wait = retry_after(asked, time.time())
            await _drain(response)
    except _CutOff as error:
        answer = _cut_off_answer(error)
        if answer is None:
            raise
        return answer
    return status, response.reason or "", wait


class WebhookTarget(Target):
    kind = "webhook"

    def __init__(self, config: WebhookConfig, *, concurrency: int = 16) -> None:
        super().__init__(config.name, concurrency=concurrency)
        self._config = config
        self._session: aiohttp.ClientSession | None = None
        self._tls: ssl.SSLContext | None = None

    async def start(self) -> None:
        # Made once, for every request of the target. A `ca_file` that went since the config
        # was checked fails the start, which the next handoff tries again (an answer "later").
        if self._tls is None:
            self._tls = _tls_context(self._config)
        self._session = http_session(self._tls)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def deliver(self, message: InboundMessage) -> Handoff:
        config = self._config
        if self._session is None:
            await self.start()
        assert self._session is not None
        if config.format == "json":
            body, content_type = json_body(message), "application/json"
        else:
            body, content_type = message.raw, "message/rfc822"
        headers = {
            "Content-Type": content_type,
            "X-Pigeon-Dedupe-Key": message.dedupe_key,
            "X-Pigeon-Source": message.source,
            "User-Agent": "Pigeon",
            **config.headers,
        }
        if message.message_id:
            headers["X-Pigeon-Message-Id"] = message.message_id.encode("ascii", "replace").decode()
        if config.format != "json" and message.sender is not None:  # SMTP mail: its envelope (JSON has it)
            headers.update(_envelope_headers(message.sender, message.recipients))
        if config.secret:
            # (signed as they go: a `headers` entry of the config may have set the dedupe key's)
            headers["X-Pigeon-Signature"] = signature(config.secret, int(time.time()), body, headers)
        try:
            status, reason, wait = await exchange(self._session, config.url, body, headers, config.timeout)
        except Unanswered as failure:
            return Handoff(Verdict.TRANSIENT, failure.detail)
        except ValueError as error:  # a header aiohttp will not send: the message's own fault
            return Handoff(Verdict.PERMANENT, f"cannot make the request: {redact(str(error))}")
        return self._verdict(status, reason, wait)

    def _verdict(self, status: int, reason: str, wait: float | None) -> Handoff:
        """What an answer's status says of the handoff."""
        detail = f"{status} {reason}".strip()
        if 200 <= status < 300:
            return Handoff(Verdict.ACCEPTED, detail)
        if 400 <= status < 500 and status not in self._config.retry_statuses:
            return Handoff(Verdict.PERMANENT, detail)
        if wait is not None:
            return Handoff(Verdict.TRANSIENT, f"{detail} (Retry-After: {min(wait, 1e9):.0f}s)", wait)
        return Handoff(Verdict.TRANSIENT, detail)


def _cut_off_answer(error: _CutOff) -> tuple[int, str, float | None] | None:
    """The answer of a status line that came whole before the connection closed or was reset (a
    server that says 204 and hangs up has answered: taken for "no answer", a 2xx would be
    handed over again at every retry); None when it did not come whole, or is no status line."""
    if error.status_line is None:
        return None
    answer = _status_answer(error.status_line, error.then)
    if answer is None:
        return None
    status, reason, _ = answer
    if status in _ASKS_TO_WAIT:
        return status, reason, retry_after(_head_field(error.head, b"retry-after"), time.time())
    return answer


def _head_field(head: bytes, name: bytes) -> str | None:
    """The value of header field `name` (lower case) among the whole lines of the last answer
    `head` begins (after its status line), or None. Read from the bytes that came, not from
    aiohttp's parser: a reset leaves nothing of what it parsed."""
    lines = head.split(b"\n")[:-1]  # (the last is cut short, or empty)
    starts = [i for i, line in enumerate(lines) if line.startswith(b"HTTP/")]
    for line in lines[starts[-1] + 1 :] if starts else []:
        field, colon, value = line.rstrip(b"\r").partition(b":")
        if colon and field.lower() == name:
            return value.strip(b" \t").decode("latin-1")
    return None


def _status_answer(status_line: bytes, then: str) -> tuple[int, str, float | None] | None:
    """(status, reason) of a whole `status_line` after which the connection `then` ("closed",
    "was reset", "stalled"); None when it is no final answer's status line (a 1xx is interim)."""
    code, _, reason = status_line.partition(b" ")[2].partition(b" ")  # (after "HTTP/1.1 ")
    if not (code.isdigit() and len(code) == 3 and 200 <= int(code) <= 599):
        return None  # (aiohttp's parser has not refused it: it stopped at the close first)
    said = reason.decode("latin-1").strip()
    return int(code), f"{said} (the connection {then} after its status line)".lstrip(), None
