"""A mailbox that logs in with XOAUTH2: Pigeon against a real Dovecot that checks each access
token with an OAuth2 introspection endpoint (RFC 7662) the test serves itself.

The endpoint knows one good token. With it Pigeon logs in and hands the mail over; with any
other Dovecot refuses the login, and Pigeon says so in /healthz and keeps running."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

from tests.support.apps import (
    ThreadedApp,
    WebhookApp,
    customer_mail,
    imap_mailbox,
    mailbox_failure,
    mailbox_health,
    webhook_target,
)
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot
from tests.support.sinks import wait_until

GOOD_TOKEN = "good-token"
# Dovecot answers a refused login after auth_failure_delay (2 s): leave room for that, yet
# bound the wait for an answer that never comes.
REFUSAL_TIMEOUT = "4s"


class IntrospectionEndpoint(ThreadedApp):
    """POST /introspect with `token=...` (as Dovecot's oauth2 passdb sends it, introspection_mode
    = post): {"active": true, "username": "app"} for GOOD_TOKEN, {"active": false} for any other."""

    def __init__(self) -> None:
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}/introspect"
        self.tokens: list[str] = []  # every token asked about, in order

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/introspect", self._introspect)

    async def _introspect(self, request: web.Request) -> web.Response:
        token = str((await request.post()).get("token", ""))
        with self._lock:
            self.tokens.append(token)
        if token == GOOD_TOKEN:
            return web.json_response({"active": True, "username": "app"})
        return web.json_response({"active": False})

    def asked(self) -> list[str]:
        with self._lock:
            return list(self.tokens)


def xoauth2_mailbox(dovecot: Dovecot, target: str, **options: Any) -> dict[str, Any]:
    box = imap_mailbox(dovecot, target, auth="xoauth2", **options)
    if "password" not in options:
        del box["password"]  # the token comes from password_file
    return box


def test_a_good_token_from_password_file_logs_in_and_the_mail_reaches_the_webhook(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"{GOOD_TOKEN}\nthe first line alone is the token\n")
    with (
        IntrospectionEndpoint() as endpoint,
        Dovecot(tmp_path / "dovecot", oauth2_introspection_url=endpoint.url) as dovecot,
        WebhookApp() as app,
    ):
        uids = dovecot.append("app", [customer_mail(i) for i in range(3)])
        box = xoauth2_mailbox(dovecot, "hook", password_file=str(token_file))
        with PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
            assert app.wait_distinct(3, 15) == 3, node.stderr()
            wait_until(lambda: not dovecot.unseen("app"), 10)
            assert all("\\Seen" in dovecot.flags("app", uid) for uid in uids)
            health = mailbox_health(node)
            assert health["connected"] is True and health["error"] is None
        assert sum(app.accepted.values()) == 3
        assert endpoint.asked() and set(endpoint.asked()) == {GOOD_TOKEN}
        assert _sessions(dovecot, "Login: ", "method=XOAUTH2")


def test_a_refused_token_delivers_nothing_and_pigeon_keeps_running(tmp_path: Path) -> None:
    with (
        IntrospectionEndpoint() as endpoint,
        Dovecot(tmp_path / "dovecot", oauth2_introspection_url=endpoint.url) as dovecot,
        WebhookApp() as app,
    ):
        uids = dovecot.append("app", [customer_mail(i) for i in range(3)])
        box = xoauth2_mailbox(dovecot, "hook", password="bad-token", timeout=REFUSAL_TIMEOUT)
        with PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
            wait_until(lambda: mailbox_failure(node) is not None, 15)
            assert mailbox_health(node)["connected"] is False
            # It tries again: the token is checked a second time, or (should Dovecot's auth
            # penalty for the address hold that check back) a second XOAUTH2 session ends.
            wait_until(
                lambda: len(endpoint.asked()) >= 2 or len(_sessions(dovecot, "Disconnected", "method=XOAUTH2")) >= 2,
                15,
            )
            assert node.process is not None and node.process.poll() is None
            health = mailbox_health(node)
            assert health["connected"] is False and health["error"] is not None and health["last_poll"] is None
        assert endpoint.asked() and set(endpoint.asked()) == {"bad-token"}
        assert not app.headers  # nothing was even offered to the webhook
        assert dovecot.unseen("app") == uids
        assert not _sessions(dovecot, "Login: ", "method=XOAUTH2")


def test_a_refused_token_is_reported_as_a_refused_login(tmp_path: Path) -> None:
    with (
        IntrospectionEndpoint() as endpoint,
        Dovecot(tmp_path / "dovecot", oauth2_introspection_url=endpoint.url) as dovecot,
        WebhookApp() as app,
    ):
        box = xoauth2_mailbox(dovecot, "hook", password="bad-token", timeout=REFUSAL_TIMEOUT)
        with PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
            error = wait_until(lambda: mailbox_failure(node), 15)
    assert "login as app" in error and "AUTHENTICATIONFAILED" in error, error
    # What Dovecot's challenge said: the token was refused, not a password.
    assert 'auth = "xoauth2": the server refused the token (status 401, scope mail); refresh the token' in error, error


def _sessions(dovecot: Dovecot, *words: str) -> list[str]:
    """The lines of Dovecot's info log that hold every one of `words`."""
    lines = dovecot.info_log_path.read_text().splitlines()
    return [line for line in lines if all(word in line for word in words)]
