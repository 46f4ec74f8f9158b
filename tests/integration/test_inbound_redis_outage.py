"""An idle mailbox while the Redis its nodes arbitrate through is away: reported down after
`down_after`, claims said paused, and said resumed only once Redis answers again, after which
mail is handed over once."""

from __future__ import annotations

import datetime
import re
import time
from pathlib import Path

from tests.support.apps import (
    WebhookApp,
    customer_mail,
    imap_mailbox,
    mailbox_health,
    redis_in_use_for_a_while,
    webhook_target,
)
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot, RedisServer
from tests.support.sinks import wait_until


def test_an_idle_mailbox_is_down_on_a_redis_outage_and_claims_resume_only_when_redis_answers(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    redis_in_use_for_a_while(redis_server)
    box = imap_mailbox(dovecot, "hook", down_after="2s", poll_interval="60s")  # idle in IDLE for a minute
    with (
        WebhookApp() as app,
        PigeonProcess(tmp_path / "p", redis={"url": redis_server.url, "timeout": "500ms"},
                      target=[webhook_target(app)], mailbox=[box]) as node,
    ):  # fmt: skip
        wait_until(lambda: mailbox_health(node)["status"] == "ok", 20)
        redis_server.stop()
        stopped = time.monotonic()
        health = wait_until(lambda: (h := mailbox_health(node))["status"] == "down" and h, 15)
        assert time.monotonic() - stopped < 8  # down_after (2 s) from the first unanswered heartbeat
        assert "Redis at redis://127.0.0.1:" in health["error"]
        assert node.http_get("/healthz")[0] == 503
        node.wait_stderr("claims paused", timeout=10)  # at once, not at the next poll a minute later
        time.sleep(3)  # rounds that need no claim go on meanwhile: none of them says Redis is back
        assert "claims resumed" not in node.stderr()
        assert mailbox_health(node)["status"] == "down"
        redis_server.start()
        redis_in_use_for_a_while(redis_server)  # (this test is not about the pause after data loss)
        node.wait_stderr("claims resumed", timeout=15)
        wait_until(lambda: mailbox_health(node)["status"] == "ok", 10)
        dovecot.append("app", [customer_mail(1)])
        assert app.wait_distinct(1, 20) == 1
        logged = node.stderr()
    assert sum(app.accepted.values()) == 1
    assert logged.count("claims paused") == 1, logged
    assert logged.count("claims resumed") == 1, logged
    # The outage's end is news, no trouble: INFO, as the target's "accepts messages again" is.
    assert re.search(r"INFO .*mailbox support: arbitration answers again; claims resumed", logged), logged
    print("LOGGED", [line for line in logged.splitlines() if "claims" in line or "Redis" in line])


def test_after_redis_lost_its_data_the_pause_runs_from_the_heartbeat_that_finds_it_not_from_the_next_mail(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    redis_in_use_for_a_while(redis_server)
    box = imap_mailbox(dovecot, "hook", poll_interval="60s")  # idle: no claim until mail comes
    with (
        WebhookApp() as app,
        PigeonProcess(tmp_path / "p", redis={"url": redis_server.url}, target=[webhook_target(app)],
                      mailbox=[box]) as node,
    ):  # fmt: skip
        wait_until(lambda: mailbox_health(node)["status"] == "ok", 20)
        redis_server.restart()  # without its data
        node.wait_stderr("lost its data: pausing claims 6.0s", timeout=10)  # found by a heartbeat, no mail needed
        time.sleep(6.5)  # the pause (a heartbeat, two 2 s timeouts and a second) is over
        dovecot.append("app", [customer_mail(1)])
        appended = time.time()
        assert app.wait_distinct(1, 20) == 1
        took = app.first_arrivals()[next(iter(app.accepted))] - appended
        logged = node.stderr()
    assert took < 2, f"handed over {took:.1f}s after it came"
    assert logged.count("lost its data") == 1, logged


def test_redis_back_without_its_data_after_an_outage_says_claims_resumed_only_once_the_pause_is_over(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    redis_in_use_for_a_while(redis_server)
    box = imap_mailbox(dovecot, "hook", poll_interval="60s")
    with (
        WebhookApp() as app,
        PigeonProcess(tmp_path / "p", redis={"url": redis_server.url, "timeout": "500ms"},
                      target=[webhook_target(app)], mailbox=[box]) as node,
    ):  # fmt: skip
        wait_until(lambda: mailbox_health(node)["status"] == "ok", 20)
        redis_server.stop()
        node.wait_stderr("claims paused", timeout=10)
        redis_server.start()  # without its data
        node.wait_stderr("lost its data: pausing claims", timeout=10)
        node.wait_stderr("claims resumed", timeout=15)  # when the pause ends, with no mail to wake it
        dovecot.append("app", [customer_mail(1)])
        assert app.wait_distinct(1, 20) == 1
        logged = node.stderr()
    assert logged.count("claims resumed") == 1, logged
    pausing = re.search(r"^(\S+ \S+) .*lost its data: pausing claims ([\d.]+)s", logged, re.MULTILINE)
    resumed = re.search(r"^(\S+ \S+) .*claims resumed", logged, re.MULTILINE)
    assert pausing and resumed, logged
    paused = _logged_at(resumed[1]) - _logged_at(pausing[1])
    assert float(pausing[2]) - 0.2 <= paused <= float(pausing[2]) + 3, logged  # not before the pause ends


def _logged_at(stamp: str) -> float:
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_a_busy_mailbox_says_claims_paused_at_once_and_its_failed_renewals_once_per_outage(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    """Handoffs to a slow target in flight when Redis dies: the mailbox said `claims paused` only
    when the batch ended (7-9 s later), and `cannot renew N claims` at WARNING every second of
    the outage. Now: paused within about a second, as an idle mailbox says it; the renewal
    failure once, and that renewals work again once Redis is back."""
    redis_in_use_for_a_while(redis_server)
    dovecot.append("app", [customer_mail(i) for i in range(6)])
    box = imap_mailbox(dovecot, "hook", concurrency=2, lease="3s")  # renewed every second
    with WebhookApp() as app:
        app.delay = 4.0  # the batch takes 12 s, 2 at a time
        with PigeonProcess(tmp_path / "p", redis={"url": redis_server.url, "timeout": "500ms"},
                           target=[webhook_target(app)], mailbox=[box]) as node:  # fmt: skip
            wait_until(lambda: mailbox_health(node)["claims"] > 0, 20)
            redis_server.stop()
            stopped = time.monotonic()
            node.wait_stderr("claims paused", timeout=10)
            paused_after = time.monotonic() - stopped
            # Renewals fail every second meanwhile. (Back before the heartbeat runs out: past
            # that the rest of the batch would be given back, with nothing left to renew.)
            time.sleep(max(0.0, stopped + 2.3 - time.monotonic()))
            during = node.stderr()
            assert paused_after < 2.0, f"claims paused {paused_after:.1f}s after Redis died:\n{during}"
            assert during.count("cannot renew") == 1, during
            redis_server.start()
            redis_in_use_for_a_while(redis_server)
            node.wait_stderr("claims renewed again", timeout=10)
            node.wait_stderr("claims resumed", timeout=15)
            assert app.wait_distinct(6, 30) == 6
            logged = node.stderr()
    assert logged.count("claims paused") == 1, logged
    assert logged.count("claims resumed") == 1, logged
    (renewed,) = [line for line in logged.splitlines() if "claims renewed again" in line]
    assert re.search(r"INFO .*mailbox support: claims renewed again, after \d+ failed attempts in \d+s$", renewed)
    assert sum(app.accepted.values()) == 6  # each once
