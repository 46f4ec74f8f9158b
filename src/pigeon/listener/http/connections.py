"""The public HTTP listener's bounds on its connections: how long a request's headers may take,
how slowly its body may come, how long a connection may sit silent between requests, and how
many may be open at once (`[http] header_timeout`, `body_timeout`, `min_body_rate`,
`keepalive_timeout`, `max_connections`; nginx's client_header_timeout, client_body_timeout,
keepalive_timeout and worker_connections).

aiohttp has none of them but an idle timeout of an hour: a connection that sends nothing, or
its headers a byte at a time, stays open, and anyone may open as many as they like, without a
token. Each is an open file of the process that, with one worker, also takes SMTP mail and
writes the spool: a thousand idle ones left it none for either.

A connection's clocks, one of which runs at any time (`_GuardedHandler._deadline`):

- waiting for a request, nothing of it heard yet: `header_timeout` from the connection's start
  (for its first request), `keepalive_timeout` from the previous answer; then it is closed
  without a word, as any server closes an idle keep-alive connection;
- a request's line and headers, once some of it is heard: `header_timeout` from the
  connection's start (the first request) or from its first byte; then 408;
- its body: `body_timeout` from the end of the headers, pushed back by 1/`min_body_rate`
  seconds for every byte that arrives, but never past `body_timeout` from now (as SMTP's
  message content, `pigeon.listener.smtp`); then 408. While Pigeon reads none of it (the
  handler is busy, the buffer full) the time is not the client's;
- an answer the client does not read: writing held up (the socket's buffer full) for
  `body_timeout`, then the connection is closed.

Past `max_connections`, a newcomer takes the place of the connection that has waited longest
for a request with nothing of it heard (closed, as by `keepalive_timeout`); with none such, the
newcomer gets 503 and is closed. The node's private control sockets have none of this: only
the supervisor talks there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Final, cast

from aiohttp import web
from aiohttp.web_request import BaseRequest

from pigeon.config.schema import HttpConfig
from pigeon.listener.http.errors import JsonErrorsHandler, JsonErrorsRunner, JsonErrorsServer

_log = logging.getLogger(__name__)
# A listener at its cap says so at most this often, with what it did meanwhile.
_REPORT_EVERY: Final = 60.0
# After an answer that ends a connection (408, 503), what the client still sends is read and
# dropped for up to this long before the connection closes: closed with bytes unread, the
# kernel would reset it, and the client might lose the answer before it reads it.
_LINGER: Final = 1.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The bounds of one listener (see the module's docstring)."""

    max_connections: int
    header_timeout: float
    keepalive_timeout: float
    body_timeout: float
    min_body_rate: float

    @classmethod
    def of(cls, http: HttpConfig, max_connections: int | None = None) -> ConnectionLimits:
        """`[http]`'s bounds; `max_connections`: the cap this process keeps to instead, when its
        open files limit holds it below `[http] max_connections` (`pigeon.node.descriptors`)."""
        return cls(
            max_connections=http.max_connections if max_connections is None else max_connections,
            header_timeout=http.header_timeout,
            keepalive_timeout=http.keepalive_timeout,
            body_timeout=http.body_timeout,
            min_body_rate=http.min_body_rate,
        )


class GuardedRunner(JsonErrorsRunner):
    """A `JsonErrorsRunner` whose connections are held to `limits`."""

    def __init__(self, app: web.Application, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.limits = limits

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _GuardedServer  # as `JsonErrorsRunner` does: aiohttp has no hook for its handlers
        cast(_GuardedServer, server).guard = _Guard(self.limits)
        return server


class _GuardedServer(JsonErrorsServer):
    guard: _Guard

    def __call__(self) -> web.RequestHandler:
        return _GuardedHandler(self, loop=self._loop, **self._kwargs)


class _Guard:
    """The open connections of one listener, in the order they were last answered (or opened):
    the first that is waiting with nothing heard is the one that has waited longest."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.open: dict[_GuardedHandler, None] = {}
        self._closed_idle = 0
        self._refused = 0
        self._reported: float | None = None

    def admit(self, newcomer: _GuardedHandler) -> bool:
        """Take a newcomer in, making room if need be; False: refuse it (none idle)."""
        if len(self.open) >= self.limits.max_connections:
            idle = next((handler for handler in self.open if handler.idle()), None)
            if idle is None:
                self._refused += 1
                self._report()
                return False
            self._closed_idle += 1
            self.forget(idle)
            idle.evict()
            self._report()
        self.open[newcomer] = None
        return True

    def answered(self, handler: _GuardedHandler) -> None:
        """Move to the end: the connection waiting longest stays first."""
        if self.open.pop(handler, False) is None:
            self.open[handler] = None

    def forget(self, handler: _GuardedHandler) -> None:
        self.open.pop(handler, None)

    def _report(self) -> None:
        now = time.monotonic()
        if self._reported is not None and now - self._reported < _REPORT_EVERY:
            return
        _log.warning(
            "http: %d connections open, [http] max_connections: %d idle ones closed to make room and %d newcomers "
            "refused (503) %s",
            self.limits.max_connections,
            self._closed_idle,
            self._refused,
            "so far" if self._reported is None else f"in the last {now - self._reported:.0f}s",
        )
        self._reported = now
        self._closed_idle = self._refused = 0


class _GuardedHandler(JsonErrorsHandler):
    """aiohttp's handler of one connection, with the clocks of the module's docstring."""

    __slots__ = ("_answered", "_body_deadline", "_cut", "_guard", "_heard", "_since", "_stalled_since", "_timer")

    def __init__(self, manager: _GuardedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = manager.guard
        self._answered = 0  # requests answered: those parsed (`_request_count`) beyond are in hand
        self._since = 0.0  # the connection's start, the last answer, or the first byte heard since
        self._heard = False  # some of the next request has arrived
        self._body_deadline: float | None = None
        self._stalled_since: float | None = None  # writing held up by a client that does not read
        self._timer: asyncio.TimerHandle | None = None
        self._cut = False  # closed by one of the clocks

    # --- what aiohttp calls ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._since = self._loop.time()
        if self._guard.admit(self):
            self._arm()
            return
        limit = self._guard.limits.max_connections
        message = f"{limit} connections open ([http] max_connections), none of them idle: try again shortly"
        self._answer(503, "Service Unavailable", message, "Retry-After: 1\r\n")

    def connection_lost(self, exc: BaseException | None) -> None:
        self._guard.forget(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._cut:
            return  # answered and closing (`_answer`): dropped
        now = self._loop.time()
        limits = self._guard.limits
        if self._in_hand():
            deadline = self._body_deadline
            if deadline is not None:
                if limits.min_body_rate > 0:
                    deadline += len(data) / limits.min_body_rate
                self._body_deadline = min(deadline, now + limits.body_timeout)
            super().data_received(data)
            return
        heard = self._heard
        if not heard:
            self._heard = True
            if self._answered:  # a later request: its headers' time starts now
                self._since = now
        super().data_received(data)
        if self._in_hand():  # the headers are all here: the body's clock starts
            self._heard = False
            self._body_deadline = now + limits.body_timeout
            self._arm(again=True)
        elif not heard:
            self._arm(again=True)

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._answered += 1
            now = self._loop.time()
            self._since = now
            # A request that came with this one (pipelined) has been parsed: its body's clock starts.
            self._body_deadline = now + self._guard.limits.body_timeout if self._in_hand() else None
            self._guard.answered(self)
            self._arm(again=True)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._stalled_since = self._loop.time()
        self._arm(again=True)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stalled_since = None

    def handle_error(
        self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if self._cut:
            # The handler could not read on from a connection a clock closed: no error of
            # its own to log, and no answer can go out (it has had its 408).
            return web.Response(status=408)
        return super().handle_error(request, status, exc, message)

    # --- the clocks ------------------------------------------------------------------------
    def idle(self) -> bool:
        """Waiting for a request with nothing of it heard: may make room for a newcomer."""
        return not self._in_hand() and not self._heard and not self._cut

    def evict(self) -> None:
        """Close (an idle connection: see `idle`) to make room for a newcomer."""
        _log.debug("http: closing an idle connection to make room ([http] max_connections)")
        self._cut = True
        self.force_close()

    def _in_hand(self) -> bool:
        """A request has been parsed and not yet answered."""
        return self._request_count > self._answered

    def _deadline(self, now: float) -> tuple[float, str] | None:
        """When the clock that runs now runs out, and which it is; None: none runs (the handler
        is at work on a request whose body is in)."""
        limits = self._guard.limits
        clocks: list[tuple[float, str]] = []
        if self._stalled_since is not None:
            clocks.append((self._stalled_since + limits.body_timeout, "answer"))
        if not self._in_hand():
            if self._heard:
                clocks.append((self._since + limits.header_timeout, "headers"))
            elif self._answered:
                clocks.append((self._since + limits.keepalive_timeout, "idle"))
            else:
                clocks.append((self._since + limits.header_timeout, "idle"))
        elif self._body_deadline is not None:
            request = self._current_request
            if request is None or not request.content.is_eof():  # (None: its handler has yet to start)
                if self._reading_paused or self._buffer_paused:
                    # Pigeon is the slow one: the client has had no chance to send.
                    self._body_deadline = max(self._body_deadline, now + limits.body_timeout)
                clocks.append((self._body_deadline, "body"))
        return min(clocks) if clocks else None

    def _arm(self, *, again: bool = False) -> None:
        """Set the timer for the running clock. `again`: it may run out sooner than the
        timer set (a new clock); otherwise a clock only moves later, and the timer, when it
        fires, finds how much later."""
        if self._timer is not None:
            if not again:
                return
            self._timer.cancel()
            self._timer = None
        if self._cut or self.transport is None:
            return
        deadline = self._deadline(self._loop.time())
        if deadline is not None:
            self._timer = self._loop.call_at(deadline[0], self._check)

    def _check(self) -> None:
        self._timer = None
        if self._cut or self.transport is None:
            return
        now = self._loop.time()
        deadline = self._deadline(now)
        if deadline is None:
            return
        when, clock = deadline
        if when > now:
            self._timer = self._loop.call_at(when, self._check)
            return
        if clock == "body" and self._current_request is None:
            # No handler reads it: it has answered, and what is left of the body is aiohttp's,
            # which reads and drops it for a moment after the answer (`lingering_time`).
            self._body_deadline = None
            self._arm()
            return
        limits = self._guard.limits
        self._guard.forget(self)
        if clock == "headers":
            self._answer(408, "Request Timeout", f"the request's headers took longer than [http] header_timeout "
                         f"({limits.header_timeout:g}s)")  # fmt: skip
        elif clock == "body":
            self._answer(408, "Request Timeout", f"the request's body came slower than [http] min_body_rate "
                         f"({limits.min_body_rate:g} bytes a second) beyond [http] body_timeout "
                         f"({limits.body_timeout:g}s)")  # fmt: skip
        else:
            if clock == "answer":
                reason = "its answer unread for [http] body_timeout"
            else:
                reason = f"silent for [http] {'keepalive_timeout' if self._answered else 'header_timeout'}"
            _log.debug("http: closing a connection: %s", reason)
            self._cut = True
            self.force_close()

    def _answer(self, status: int, reason: str, message: str, headers: str = "") -> None:
        """Say `status` with a JSON error (written as it is: no request may be in a state to
        take an answer through aiohttp) and close the connection."""
        _log.debug("http: %d and closing a connection: %s", status, message)
        self._cut = True
        # The API's one error shape (`errors`): nothing of the request is at fault, so `field` is null.
        body = json.dumps({"error": message, "field": None}).encode()
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n{headers}Connection: close\r\n\r\n"
        )
        transport = self.transport
        if transport is None:
            return
        transport.write(head.encode() + body)
        if not transport.can_write_eof():
            self.force_close()
            return
        transport.write_eof()  # the client reads the answer to its end; it closes its side then
        # aiohttp's loop for this connection ends here, as with `force_close`, but the
        # transport stays open (reading) until the client closes or `_LINGER` is over.
        self._force_close = True
        if self._waiter is not None:
            self._waiter.cancel()
        self._loop.call_later(_LINGER, self.force_close)
