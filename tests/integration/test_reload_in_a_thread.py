"""A reload reads its files and imports the policy module off the event loop: a slow import
stalls neither mail nor /healthz, and one that outlasts `[node] reload_timeout` is abandoned."""

from __future__ import annotations

import json
import signal
import smtplib
import textwrap
import time
from pathlib import Path

from tests.support.process import PigeonProcess

MESSAGE = b"Subject: reload\r\n\r\nhello\r\n"
REFUSING = """
    import time
    time.sleep({sleep})
    from pigeon.policy import Refuse
    def on_rcpt_to(rcpt):
        return Refuse(550, "{text}", "5.7.1")
"""


def _write_policy(path: Path, *, sleep: float, text: str) -> None:
    path.write_text(textwrap.dedent(REFUSING.format(sleep=sleep, text=text)))


def _send(pigeon: PigeonProcess) -> dict[str, tuple[int, bytes]]:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
        return client.sendmail("a@src.test", ["b@dst.test"], MESSAGE)


def _refused_with(pigeon: PigeonProcess) -> bytes:
    try:
        _send(pigeon)
    except smtplib.SMTPRecipientsRefused as refused:
        return refused.recipients["b@dst.test"][1]
    return b"(accepted)"


def _node(tmp_path: Path, **node: str | int) -> tuple[PigeonProcess, Path]:
    policy = tmp_path / "mypolicy.py"
    policy.write_text("def on_message(message):\n    return None\n")
    sections = {"workers": 2, "worker_timeout": "3s", **node}
    return PigeonProcess(tmp_path / "node", node=sections, policy={"module": str(policy)}), policy


def test_a_slow_policy_import_at_sighup_stalls_neither_mail_nor_healthz(tmp_path: Path) -> None:
    pigeon, policy = _node(tmp_path)
    with pigeon:
        assert pigeon.process is not None
        _write_policy(policy, sleep=6, text="the new policy")
        pigeon.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5  # the import sleeps 6 s, twice [node] worker_timeout
        while time.monotonic() < deadline:
            started = time.monotonic()
            status, body = pigeon.http_get("/healthz")
            assert status == 200 and json.loads(body)["status"] == "ok", body
            assert _send(pigeon) == {}  # the running policy: accepted
            assert time.monotonic() - started < 1.5
        assert "has not answered the supervisor" not in pigeon.stderr()
        pigeon.wait_stderr("reloaded:", 2, timeout=15)
        assert b"the new policy" in _refused_with(pigeon)
        assert "has not answered the supervisor" not in pigeon.stderr()
        assert "restarting" not in pigeon.stderr()


def test_a_reading_that_outlasts_reload_timeout_is_abandoned_and_a_sighup_then_reads_again(tmp_path: Path) -> None:
    pigeon, policy = _node(tmp_path, reload_timeout="2s")
    with pigeon:
        assert pigeon.process is not None
        _write_policy(policy, sleep=5, text="the slow policy")
        pigeon.process.send_signal(signal.SIGHUP)
        said = pigeon.wait_stderr("reload abandoned: still importing the policy module", 2, timeout=6)
        assert "after 2s ([node] reload_timeout); the running configuration stays" in said
        assert _send(pigeon) == {}  # the running policy
        _write_policy(policy, sleep=0, text="the quick policy")
        pigeon.process.send_signal(signal.SIGHUP)
        said = pigeon.wait_stderr("reloaded:", 2, timeout=4)  # at once, not after the abandoned one
        assert "reload: the abandoned reading ended after all" not in said
        assert b"the quick policy" in _refused_with(pigeon)
        pigeon.wait_stderr("reload: the abandoned reading ended after all (read); it was dropped", 2, timeout=10)
        assert b"the quick policy" in _refused_with(pigeon)  # what it read is dropped
        assert "has not answered the supervisor" not in pigeon.stderr()


def test_a_policy_import_that_never_ends_does_not_block_the_next_reload(tmp_path: Path) -> None:
    pigeon, policy = _node(tmp_path, reload_timeout="1s")
    with pigeon:
        assert pigeon.process is not None
        _write_policy(policy, sleep=3600, text="the stuck policy")
        pigeon.process.send_signal(signal.SIGHUP)
        pigeon.wait_stderr("reload abandoned: still importing the policy module", 2, timeout=6)
        _write_policy(policy, sleep=0, text="the fixed policy")
        pigeon.process.send_signal(signal.SIGHUP)
        pigeon.wait_stderr("reloaded:", 2, timeout=6)
        assert b"the fixed policy" in _refused_with(pigeon)
        # A second import that never ends, while the first still runs: no third thread, and the
        # log says what to do.
        _write_policy(policy, sleep=3600, text="the stuck policy")
        pigeon.process.send_signal(signal.SIGHUP)
        said = pigeon.wait_stderr("and an earlier abandoned reading still runs too", 2, timeout=6)
        assert "restart this worker" in said
        pigeon.process.send_signal(signal.SIGHUP)
        pigeon.wait_stderr("reload: still reading for the last SIGHUP", 2)
        assert b"the fixed policy" in _refused_with(pigeon)
        assert "has not answered the supervisor" not in pigeon.stderr()


def test_a_stop_during_a_reading_says_nothing_of_an_abandoned_reading(tmp_path: Path) -> None:
    pigeon, policy = _node(tmp_path, reload_timeout="30s")
    with pigeon:
        assert pigeon.process is not None
        _write_policy(policy, sleep=3, text="the slow policy")
        pigeon.process.send_signal(signal.SIGHUP)
        time.sleep(1)
        client = smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10)
        client.ehlo()
        client.mail("a@src.test")  # an open transaction: that worker's stop waits for it
        pigeon.process.send_signal(signal.SIGTERM)
        time.sleep(4)  # the reading ends meanwhile
        client.docmd("QUIT")
        client.close()
        assert pigeon.process.wait(30) == 0
    assert "abandoned" not in pigeon.stderr()
