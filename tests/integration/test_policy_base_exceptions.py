"""A hook that raises a BaseException that is no Exception (`sys.exit()`, KeyboardInterrupt, a
CancelledError of its own, GeneratorExit, BaseException itself) fails as any other raising hook
does: the documented answer (451 4.3.0, 421 at connect, the message deferred or the attempt's
outcome kept), a PolicyFailure with the traceback, and the worker serving on. Before, each of
them ended the worker (a message delivered but not recorded was sent again after the restart,
one whose before_delivery raised crashed every restart) or left its caller waiting for good (a
message in flight for ever, a client unanswered). A stop of the node during a hook is still a
stop: Pigeon's own cancellation of the hook's task is not taken for the hook's failure."""

from __future__ import annotations

import smtplib
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

MESSAGE = b"From: <sender@example.org>\r\nSubject: hello\r\n\r\nHello.\r\n"
ERROR = b"4.3.0 policy error; try again later"

# Every hook raises `KIND` for one of the things it is shown: a peer, a sender, a recipient, a
# Subject, a message's first attempt, an outcome. `CALL` is how a hook calls `_fail`.
_MODULE = """
    import asyncio

    KIND = {kind!r}

    def _fail():
        if KIND == "SystemExit":
            raise SystemExit("policy wants out")
        if KIND == "KeyboardInterrupt":
            raise KeyboardInterrupt
        if KIND == "CancelledError":
            raise asyncio.CancelledError("the hook's own")
        if KIND == "GeneratorExit":
            raise GeneratorExit
        raise BaseException("a bare BaseException")

    async def _fail_async():
        await asyncio.sleep(0)
        if KIND == "CancelledError":  # as a hook meets one: a future it awaits is cancelled
            future = asyncio.get_running_loop().create_future()
            future.cancel()
            await future
        _fail()

    {prefix}def on_connect(connection):
        if connection.peer_ip == "127.0.0.2":
            {call}
    {prefix}def on_mail_from(mail):
        if mail.sender.startswith("bad@"):
            {call}
    {prefix}def on_rcpt_to(rcpt):
        if rcpt.recipient.startswith("bad@"):
            {call}
    {prefix}def on_message(message):
        if message.headers["Subject"] == "bad":
            {call}
    {prefix}def before_delivery(delivery):
        if delivery.attempt == 1 and delivery.recipients[0].startswith("first@"):
            {call}
    {prefix}def on_delivery_outcome(outcome):
        if outcome.delivery.recipients[0].startswith("outcome@"):
            {call}
"""
KINDS = ["SystemExit", "KeyboardInterrupt", "CancelledError", "GeneratorExit", "BaseException"]


def _node(root: Path, mode: str, kind: str, **sections: Any) -> PigeonProcess:
    if mode == "async":
        prefix, call, sync = "async ", "await _fail_async()", "inline"
    else:
        prefix, call, sync = "", "_fail()", mode
    source = textwrap.dedent(_MODULE).format(kind=kind, prefix=prefix, call=call)
    root.mkdir(parents=True, exist_ok=True)
    module = root / "policy.py"
    module.write_text(source)
    policy = {"module": str(module), "timeout": "5s", "sync": sync}
    return PigeonProcess(root / "node", policy=policy, **sections)


MODES = ["inline", "async", "thread"]
# Every kind in every mode is the unit tests' (tests/unit/policy/test_hooks.py); through a node,
# each kind once by default, every mode among them, the hook's own CancelledError where it is
# hardest to tell from Pigeon's (async) (a node each: some 10 s); all of them in the slow run.
_DEFAULT = {
    ("SystemExit", "inline"),
    ("KeyboardInterrupt", "thread"),
    ("CancelledError", "async"),
    ("GeneratorExit", "inline"),
    ("BaseException", "async"),
}
CASES = [
    pytest.param(mode, kind, marks=() if (kind, mode) in _DEFAULT else pytest.mark.slow)
    for kind in KINDS
    for mode in MODES
]


@pytest.mark.parametrize(("mode", "kind"), CASES)
def test_a_hook_raising_a_base_exception_fails_as_any_hook_does_and_the_worker_serves_on(
    tmp_path: Path, mode: str, kind: str
) -> None:
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint, retry_interval="0.5s", dsn=False)
        with _node(tmp_path, mode, kind, **config) as pigeon:
            assert pigeon.process is not None
            pid = pigeon.process.pid
            with RawSmtp(pigeon.smtp_port, source="127.0.0.2") as client:
                assert client.reply() == (421, ["policy error; try again later"])
                assert client.closed_by_peer()
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                client.ehlo("client.test")
                assert client.mail("bad@example.org") == (451, ERROR)
                assert client.mail("a@example.org")[0] == 250
                assert client.rcpt("bad@example.net") == (451, ERROR)
                assert client.rcpt("ok@example.net")[0] == 250
                assert client.data(b"From: <a@example.org>\r\nSubject: bad\r\n\r\nhi\r\n") == (451, ERROR)
                client.sendmail("a@example.org", ["first@example.net"], MESSAGE)  # before_delivery raises once
                client.sendmail("a@example.org", ["outcome@example.net"], MESSAGE)  # on_delivery_outcome raises
            # The message whose before_delivery raised was deferred (451 4.3.0), then delivered.
            (transient,) = pigeon.wait_records("TransientFailure")
            assert (transient["recipient"], transient["response"]["code"]) == ("first@example.net", 451)
            assert transient["response"]["enhanced"] == "4.3.0"
            deliveries = pigeon.wait_records("Delivery", 2)
            assert sorted((d["recipient"], d["attempt"]) for d in deliveries) == [
                ("first@example.net", 2),
                ("outcome@example.net", 1),
            ]
            failures = pigeon.wait_records("PolicyFailure", 6)
            assert {f["hook"]: f["action"] for f in failures} == {
                "on_connect": "421",
                "on_mail_from": "451 4.3.0",
                "on_rcpt_to": "451 4.3.0",
                "on_message": "451 4.3.0",
                "before_delivery": "deferred",
                "on_delivery_outcome": "kept",
            }
            for failure in failures:
                assert failure["error"].partition(":")[0].endswith(kind), failure
                assert "Traceback (most recent call last)" in failure["traceback"] and "_fail" in failure["traceback"]
            # Each message sent once, none left in the spool (none stuck in flight), and the
            # same process still serving.
            assert sorted(r.recipients[0] for r in sink.after(1.5)) == ["first@example.net", "outcome@example.net"]
            wait_until(lambda: pigeon.spool_messages() == [])
            assert len(pigeon.records("PolicyFailure")) == 6
            assert pigeon.process.poll() is None and pigeon.process.pid == pid
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                assert client.ehlo("client.test")[0] == 250
            assert "Fatal error" not in pigeon.stderr()


def test_a_stop_during_slow_async_hooks_stops_the_node_and_is_not_taken_for_their_failure(tmp_path: Path) -> None:
    """SIGTERM while an async before_delivery and an async on_mail_from wait: Pigeon cancels
    the hooks' tasks; that cancellation is its own, and goes on (no PolicyFailure, no deferral
    recorded against the message), and the node stops within its shutdown grace."""
    source = """
        import asyncio
        async def on_mail_from(mail):
            if mail.sender.startswith("slow@"):
                await asyncio.sleep(60)
        async def before_delivery(delivery):
            await asyncio.sleep(60)
    """
    root = tmp_path / "root"
    root.mkdir()
    module = root / "policy.py"
    module.write_text(textwrap.dedent(source))
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint)
        pigeon = PigeonProcess(
            root / "node",
            policy={"module": str(module), "timeout": "120s"},
            node={"shutdown_timeout": "2s"},
            **config,
        )
        with pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                client.sendmail("a@example.org", ["ok@example.net"], MESSAGE)
            slow = smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=30)
            slow.ehlo("client.test")
            slow.send(b"MAIL FROM:<slow@example.org>\r\n")  # its hook now waits
            time.sleep(1)  # both hooks are waiting now
            started = time.monotonic()
            assert pigeon.stop() == 0
            assert time.monotonic() - started < 8
            slow.close()
        assert pigeon.records("PolicyFailure") == []
        assert pigeon.records("TransientFailure") == []
        assert [m["recipients"] for m in pigeon.spool_messages()] == [["ok@example.net"]]  # kept for the next start
        assert sink.received == []
