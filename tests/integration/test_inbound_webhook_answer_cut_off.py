"""A webhook's answer is its status line: one that came whole (its CRLF too) is the answer,
whatever becomes of the rest (the connection closed before the headers end, or in the body). A
2xx cut off so is accepted once, not handed over again at every retry; a 410 is still "never",
a 503 "later"; only a status line itself cut short (no CRLF) is no answer ("later")."""

from __future__ import annotations

import contextlib
import smtplib
import socket
import struct
import threading
import time
from pathlib import Path

import aiohttp
import aiohttp.client_proto
import aiohttp.http_parser
import msgspec
import pytest

from pigeon.config.schema import WebhookTarget as WebhookConfig
from pigeon.config.schema import decode_hook
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Verdict
from pigeon.inbound.targets.webhook import WebhookTarget
from tests.support.apps import customer_mail, imap_mailbox
from tests.support.process import ROOT, PigeonProcess
from tests.support.services import Dovecot
from tests.support.sinks import wait_until


class _CutOffApp:
    """Reads each request whole, sends `answer`, and closes the connection."""

    def __init__(self, answer: bytes, stall: float = 0.0, *, reset: bool = False) -> None:
        self.answer = answer
        self.stall = stall  # seconds it says nothing more before it closes
        self.reset = reset  # closes with a TCP RST (SO_LINGER 0), not a FIN
        self.requests = 0
        self.heads: list[bytes] = []  # each request's head
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/inbound"

    def __enter__(self) -> _CutOffApp:
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # the test is over
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection, contextlib.suppress(OSError):
            connection.settimeout(5)
            request = b""
            while b"\r\n\r\n" not in request and (chunk := connection.recv(65536)):
                request += chunk
            head, _, body = request.partition(b"\r\n\r\n")
            fields = (line.split(b":", 1) for line in head.split(b"\r\n")[1:])
            length = next(int(value) for name, value in fields if name.lower() == b"content-length")
            while len(body) < length and (chunk := connection.recv(65536)):
                body += chunk
            self.requests += 1
            self.heads.append(head)
            connection.sendall(self.answer)
            time.sleep(self.stall)
            if self.reset:
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.fixture(params=["C", "pure-Python"])
def aiohttp_parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """aiohttp's response parser: its C one (when built) or its pure-Python one, which tell
    the part of a head that came apart differently."""
    if request.param == "pure-Python":
        monkeypatch.setattr(aiohttp.client_proto, "HttpResponseParser", aiohttp.http_parser.HttpResponseParserPy)
    elif aiohttp.client_proto.HttpResponseParser is aiohttp.http_parser.HttpResponseParserPy:
        pytest.skip("aiohttp's C parser is not built here")
    return str(request.param)


def _webhook(url: str) -> WebhookTarget:
    config = {"name": "hook", "kind": "webhook", "url": url, "timeout": "3s"}
    return WebhookTarget(msgspec.convert(config, WebhookConfig, dec_hook=decode_hook))


@pytest.mark.parametrize(
    ("answer", "verdict", "detail"),
    [
        (
            b"HTTP/1.1 204 No Content\r\n",
            Verdict.ACCEPTED,
            "204 No Content (the connection closed after its status line)",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n",
            Verdict.ACCEPTED,
            "200 OK (the connection closed after its status line)",
        ),
        (b"HTTP/1.1 204\r\n", Verdict.ACCEPTED, "204 (the connection closed after its status line)"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", Verdict.ACCEPTED, "200 OK"),
        (b"HTTP/1.1 410 Gone\r\n", Verdict.PERMANENT, "410 Gone (the connection closed after its status line)"),
        (
            b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\n",
            Verdict.TRANSIENT,
            "503 Busy (the connection closed after its status line) (Retry-After: 7s)",
        ),
        (b"HTTP/1.1 204 No Content", Verdict.TRANSIENT, 'bad HTTP response: cut off after "HTTP/1.1 204 No Content"'),
        (b"HTTP/1.1 200", Verdict.TRANSIENT, 'bad HTTP response: cut off after "HTTP/1.1 200"'),
    ],
    ids=["status-only", "mid-headers", "no-reason", "mid-body", "410", "503", "status-line-cut", "code-only"],
)
async def test_a_webhook_answer_is_its_status_line_once_that_came_whole(
    aiohttp_parser: str, answer: bytes, verdict: Verdict, detail: str
) -> None:
    with _CutOffApp(answer) as app:
        target = _webhook(app.url)
        try:
            handoff = await target.deliver(InboundMessage.of(customer_mail(1), "imap:support", time.time()))
        finally:
            await target.close()
    assert (handoff.verdict, handoff.detail.removeprefix(f"{app.url}: ")) == (verdict, detail)
    assert app.requests == 1


@pytest.mark.parametrize("answer", [b"HTTP/1.1 204 No Content\r\n", b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"])
@pytest.mark.parametrize("then", ["closed", "was reset"])
def test_a_2xx_cut_off_after_its_status_line_is_handed_over_once_at_both_doors(
    tmp_path: Path, dovecot: Dovecot, answer: bytes, then: str
) -> None:
    dovecot.append("app", [customer_mail(0)])
    with _CutOffApp(answer, reset=then == "was reset") as app:
        target = {"name": "hook", "kind": "webhook", "url": app.url, "timeout": "2s", "retry_interval": "200ms"}
        node = PigeonProcess(
            tmp_path / "p",
            delivery={"enabled": True, "retry_interval": "1s"},
            target=[target],
            mailbox=[imap_mailbox(dovecot, "hook", poll_interval="1s")],
            inbound=[{"recipient": "support@app.example", "target": "hook"}],
        )
        with node, smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
            client.sendmail("customer@example.com", ["support@app.example"], customer_mail(1))
            (received,) = node.wait_records("InboundDelivery", 1, timeout=20)
            (delivered,) = node.wait_records("Delivery", 1, timeout=20)
            wait_until(lambda: not dovecot.unseen("app"), 10)
            time.sleep(3)  # a retry, had either been called a failure, would have come by now
            failures = node.records("InboundFailure") + node.records("TransientFailure")
    assert not failures, failures
    assert received["detail"].endswith(f"(the connection {then} after its status line)"), received
    assert delivered["response"]["text"].startswith("hook: 2"), delivered
    assert app.requests == 2


async def test_the_dedupe_headers_a_webhook_gets_are_those_the_readme_tells_applications_to_use() -> None:
    with _CutOffApp(b"HTTP/1.1 204 No Content\r\n\r\n") as app:
        target = _webhook(app.url)
        message = InboundMessage.of(customer_mail(1), "imap:support", time.time())
        try:
            assert (await target.deliver(message)).accepted
        finally:
            await target.close()
    fields = dict(line.split(b": ", 1) for line in app.heads[0].split(b"\r\n")[1:])
    readme = (ROOT / "README.md").read_text()
    inbound = readme[readme.index("## Inbound routing") : readme.index("## Event log")]
    twice = next(p for p in inbound.split("\n- ") if "longer than the target's `timeout`" in p)
    for name, value in [
        ("X-Pigeon-Dedupe-Key", message.dedupe_key),
        ("X-Pigeon-Message-Id", message.message_id),
        ("X-Pigeon-Source", "imap:support"),
    ]:
        assert fields[name.encode()].decode() == value and f"`{name}`" in twice, name


@pytest.mark.parametrize(
    ("answer", "verdict", "detail"),
    [
        (
            b"HTTP/1.1 204 No Content\r\n",
            Verdict.ACCEPTED,
            "204 No Content (the connection stalled after its status line)",
        ),
        (b"HTTP/1.1 200 OK\r\nX-A: 1\r\n", Verdict.ACCEPTED, "200 OK (the connection stalled after its status line)"),
        (b"HTTP/1.1 410 Gone\r\n", Verdict.PERMANENT, "410 Gone (the connection stalled after its status line)"),
        (b"HTTP/1.1 204 No Content", Verdict.TRANSIENT, "no answer from {url} within 3s"),
        (b"HTTP/1.1 100 Continue\r\n\r\n", Verdict.TRANSIENT, "no answer from {url} within 3s"),
    ],
    ids=["status-only", "mid-headers", "410", "status-line-cut", "interim-only"],
)
async def test_a_webhook_answer_is_its_status_line_whatever_stalls_after_it(
    answer: bytes, verdict: Verdict, detail: str
) -> None:
    """Found from outside: a 204 status line, then silence past the target's timeout, was "no
    answer" and the message was handed over again at every retry."""
    with _CutOffApp(answer, stall=4.0) as app:
        target = _webhook(app.url)
        try:
            handoff = await target.deliver(InboundMessage.of(customer_mail(1), "imap:support", time.time()))
        finally:
            await target.close()
    assert (handoff.verdict, handoff.detail) == (verdict, detail.format(url=app.url))
    assert app.requests == 1


@pytest.mark.parametrize(
    ("answer", "verdict", "detail"),
    [
        (
            b"HTTP/1.1 204 No Content\r\n",
            Verdict.ACCEPTED,
            "204 No Content (the connection was reset after its status line)",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n",
            Verdict.ACCEPTED,
            "200 OK (the connection was reset after its status line)",
        ),
        (b"HTTP/1.1 410 Gone\r\n", Verdict.PERMANENT, "410 Gone (the connection was reset after its status line)"),
        (
            b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\n",
            Verdict.TRANSIENT,
            "503 Busy (the connection was reset after its status line) (Retry-After: 7s)",
        ),
        (
            b"HTTP/1.1 204 No Content",
            Verdict.TRANSIENT,
            '{url}: bad HTTP response: cut off after "HTTP/1.1 204 No Content" (the connection was reset)',
        ),
    ],
    ids=["status-only", "mid-headers", "410", "503", "status-line-cut"],
)
async def test_a_webhook_answer_is_its_status_line_when_the_connection_is_then_reset(
    aiohttp_parser: str, answer: bytes, verdict: Verdict, detail: str
) -> None:
    """Found from outside: a 204 status line, then a TCP reset (SO_LINGER 0) rather than a clean
    close, was "no answer" and the message was handed over again at every retry."""
    with _CutOffApp(answer, reset=True) as app:
        target = _webhook(app.url)
        try:
            handoff = await target.deliver(InboundMessage.of(customer_mail(1), "imap:support", time.time()))
        finally:
            await target.close()
    assert (handoff.verdict, handoff.detail) == (verdict, detail.format(url=app.url))
    assert app.requests == 1
