"""X-Pigeon-Signature's `v2` binds the headers an application routes and dedupes by (the
dedupe key, the envelope) to the body, where `v1` signs the body alone: a request seen once (in
a log, by a proxy) and sent again with another recipient list or dedupe key passes `v1` and fails
`v2`. The application here is a real aiohttp server that checks each request as it comes with
the README's own verifier (the snippet itself, run as it stands) and with `v1`; the requests
are the ones Pigeon sends, and those same requests replayed with a header changed."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import smtplib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from tests.support.apps import ThreadedApp, customer_mail
from tests.support.process import PigeonProcess
from tests.support.readme import readme_python
from tests.support.sinks import wait_until

SECRET = "s3cret-for-the-hook"

Verifier = Callable[[bytes, Mapping[str, str], bytes], bool]


def _readme_verifier() -> Verifier:
    """`from_pigeon`, as the README's "Verifying a webhook request" gives it."""
    namespace: dict[str, Any] = {}
    exec(compile(readme_python("# Verify a Pigeon webhook request"), "README.md", "exec"), namespace)
    verifier: Verifier = namespace["from_pigeon"]
    return verifier


def _v1(secret: bytes, headers: Mapping[str, str], body: bytes) -> bool:
    """`v1`, as verifiers written before `v2` check it: the body's HMAC."""
    parts = dict(part.split("=", 1) for part in headers.get("X-Pigeon-Signature", "").split(","))
    mac = hmac.new(secret, f"{parts['t']}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(mac, parts["v1"])


@dataclass(frozen=True)
class _Checked:
    headers: CIMultiDictProxy[str]
    body: bytes
    v1: bool
    v2: bool


class VerifyingApp(ThreadedApp):
    """POSTs to /inbound, each checked as it comes, with `v1` and with the README's verifier."""

    def __init__(self) -> None:
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}/inbound"
        self.verify = _readme_verifier()
        self.checked: list[_Checked] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/inbound", self._receive)

    async def _receive(self, request: web.Request) -> web.Response:
        body = await request.read()
        secret = SECRET.encode()
        checked = _Checked(
            CIMultiDictProxy(CIMultiDict(request.headers)),
            body,
            _v1(secret, request.headers, body),
            self.verify(secret, request.headers, body),
        )
        with self._lock:
            self.checked.append(checked)
        return web.Response(status=202, text="ok")

    def replay(self, request: _Checked, **changed: str | None) -> tuple[bool, bool]:
        """(v1, v2) of `request` sent again with its Pigeon headers, those in `changed` (by name,
        "_" for "-") set to another value, or left out for None."""
        headers = {name: value for name, value in request.headers.items() if name.lower().startswith("x-pigeon-")}
        headers["Content-Type"] = request.headers["Content-Type"]
        for name, value in changed.items():
            headers.pop(name.replace("_", "-"), None)
            if value is not None:
                headers[name.replace("_", "-")] = value
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request("POST", "/inbound", body=request.body, headers=headers)
            assert connection.getresponse().status == 202
        finally:
            connection.close()
        with self._lock:
            last = self.checked[-1]
        return last.v1, last.v2


def _pigeon(tmp_path: Path, app: VerifyingApp, format: str = "raw") -> PigeonProcess:
    """A node taking mail for hook.example over SMTP and posting it to `app`, signed."""
    target = {"name": "hook", "kind": "webhook", "url": app.url, "secret": SECRET, "format": format}
    return PigeonProcess(
        tmp_path / "p",
        smtp={"relay_networks": ["192.0.2.0/24"]},  # the test client is not a relay client
        delivery={"enabled": True, "retry_interval": "1s"},
        target=[target],
        inbound=[{"domain": "hook.example", "target": "hook"}],
    )


def _received(app: VerifyingApp, count: int) -> list[_Checked]:
    wait_until(lambda: len(app.checked) >= count, 20)
    return list(app.checked)


def test_raw_mail_over_smtp_passes_v1_and_the_readme_s_v2_verifier_even_from_the_null_sender(
    tmp_path: Path,
) -> None:
    with VerifyingApp() as app, _pigeon(tmp_path, app) as node, smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
        client.sendmail("customer@example.com", ["a1@hook.example", "a2@hook.example"], customer_mail(1))
        client.sendmail("", ["a3@hook.example"], customer_mail(2))  # a bounce: X-Pigeon-Sender is empty
        first, second = sorted(_received(app, 2), key=lambda r: r.headers["X-Pigeon-Recipients"])
    assert first.headers["X-Pigeon-Recipients"] == "a1@hook.example, a2@hook.example"
    assert first.headers["X-Pigeon-Sender"] == "customer@example.com"
    assert (second.headers["X-Pigeon-Sender"], second.headers["X-Pigeon-Recipients"]) == ("", "a3@hook.example")
    assert [(r.v1, r.v2) for r in (first, second)] == [(True, True), (True, True)]
    assert first.headers["X-Pigeon-Signature"].count(",v2=") == 1


def test_a_replay_with_other_recipients_or_another_dedupe_key_passes_v1_and_fails_v2(tmp_path: Path) -> None:
    with VerifyingApp() as app, _pigeon(tmp_path, app) as node, smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
        client.sendmail("customer@example.com", ["a1@hook.example", "a2@hook.example"], customer_mail(1))
        (sent,) = _received(app, 1)
        other_key = hashlib.sha256(b"another message").hexdigest()
        replays = {
            "as it was": app.replay(sent),
            "other recipients": app.replay(sent, X_Pigeon_Recipients="admin@hook.example"),
            "one recipient more": app.replay(sent, X_Pigeon_Recipients="a1@hook.example, a2@hook.example, b@x.example"),
            "another dedupe key": app.replay(sent, X_Pigeon_Dedupe_Key=other_key),
            "another sender": app.replay(sent, X_Pigeon_Sender="boss@example.com"),
            "another count": app.replay(sent, X_Pigeon_Recipients_Count="1"),
            "no recipients header": app.replay(sent, X_Pigeon_Recipients=None),
        }
    assert (sent.v1, sent.v2) == (True, True)
    assert replays == {
        "as it was": (True, True),  # (the replay itself changes nothing the verifier reads)
        "other recipients": (True, False),
        "one recipient more": (True, False),
        "another dedupe key": (True, False),
        "another sender": (True, False),
        "another count": (True, False),
        "no recipients header": (True, False),
    }


def test_a_json_body_without_envelope_headers_gets_a_v2_that_binds_its_dedupe_key(tmp_path: Path) -> None:
    with (
        VerifyingApp() as app,
        _pigeon(tmp_path, app, format="json") as node,
        smtplib.SMTP("127.0.0.1", node.smtp_port) as client,
    ):
        client.sendmail("customer@example.com", ["a1@hook.example"], customer_mail(1))
        (sent,) = _received(app, 1)
        replays = {
            "as it was": app.replay(sent),
            "recipients added": app.replay(sent, X_Pigeon_Recipients="admin@hook.example"),
            "empty sender added": app.replay(sent, X_Pigeon_Sender=""),
            "another dedupe key": app.replay(sent, X_Pigeon_Dedupe_Key="0" * 64),
        }
    assert "X-Pigeon-Recipients" not in sent.headers and "X-Pigeon-Sender" not in sent.headers
    assert (sent.v1, sent.v2) == (True, True)
    assert replays == {
        "as it was": (True, True),
        "recipients added": (True, False),
        "empty sender added": (True, False),
        "another dedupe key": (True, False),
    }
