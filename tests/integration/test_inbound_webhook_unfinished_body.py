"""A webhook's answer is its status line: a 2xx whose body never finishes (a `Content-Length` the
application does not fulfil, its connection left open) is accepted, at both doors: mail fetched
from a mailbox, and mail received over SMTP for an `[[inbound]]` route."""

from __future__ import annotations

import smtplib
import socketserver
import threading
import time
from pathlib import Path

from tests.support.apps import customer_mail, imap_mailbox
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot
from tests.support.sinks import wait_until


class _UnfinishedAnswers(socketserver.ThreadingTCPServer):
    """Answers each POST `200` with `Content-Length: 100000` and 2 bytes of it, then keeps the
    connection open (until the client closes it, or the server stops)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[bytes] = []  # each request's body
        self.lock = threading.Lock()
        self.url = f"http://127.0.0.1:{self.server_address[1]}/inbound"
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def __enter__(self) -> _UnfinishedAnswers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


class _Handler(socketserver.StreamRequestHandler):
    server: _UnfinishedAnswers

    def handle(self) -> None:
        while True:  # until the client closes the connection (its threads are daemons)
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = self.rfile.readline()
                if not line:
                    return
                head += line
            fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
            body = self.rfile.read(int(next(v for k, v in fields.items() if k.lower() == b"content-length")))
            with self.server.lock:
                self.server.requests.append(body)
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\nok")
            self.wfile.flush()


def test_a_webhook_s_2xx_is_accepted_at_both_doors_though_its_body_never_finishes(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    dovecot.append("app", [customer_mail(0)])
    with _UnfinishedAnswers() as app:
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
            time.sleep(5)  # longer than the webhook's timeout, twice: time to hand either over again
            failures = node.records("InboundFailure") + node.records("TransientFailure")
        requests = list(app.requests)
    assert not failures, failures
    assert received["detail"] == "200 OK" and delivered["response"]["text"].startswith("hook: 200 OK")
    assert len(requests) == 2, [body[:80] for body in requests]
