"""A policy's `Changes(queue=...)` names the scheduled queue outright: only a well-formed name
is taken. A malformed one is the hook's failure: `451 4.3.0` to the client and a
`PolicyFailure` record, never a crash, a message stored under a broken name, or one stuck."""

from __future__ import annotations

import smtplib
import textwrap
from collections.abc import Iterator

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import wait_until

POLICY = """
    from pigeon.policy import Changes

    NAMES = {
        "inbound": "inbound:helpdesk",  # the namespace of [[inbound]] routes' queues
        "ready": "acme->mx.example.net",  # looks like a ready queue (source->site)
        "long": "q" * 300,
        "control": "spring\\x1b[2J",
        "nul": "spring\\x00",
        "bytes": b"spring",
        "number": 42,
        "good": "vip:acme@example.net",
    }

    def on_message(message):
        return Changes(queue=NAMES[message.headers["Subject"]])
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    root = tmp_path_factory.mktemp("policy-queue")
    module = root / "policy.py"
    module.write_text(textwrap.dedent(POLICY))
    with PigeonProcess(root / "node", policy={"module": str(module)}) as pigeon:
        yield pigeon


def _send(pigeon: PigeonProcess, subject: str) -> tuple[int, bytes]:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        client.mail("sender@example.org")
        client.rcpt(f"{subject}@example.net")
        answer = client.data(f"Subject: {subject}\r\n\r\nhi\r\n".encode())
        assert client.noop()[0] == 250  # the session goes on
        return answer


@pytest.mark.parametrize(
    ("subject", "reason"),
    [
        ("inbound", "starting 'inbound:' are the [[inbound]] routes' own"),
        ("ready", "holds no '->'"),
        ("long", "at most 255 characters, not 300"),
        ("control", "no white space or control characters"),
        ("nul", "no white space or control characters"),
        ("bytes", "is a string, not bytes"),
        ("number", "is a string, not int"),
    ],
)
def test_a_malformed_queue_name_from_the_policy_gets_451_and_a_policy_failure(
    node: PigeonProcess, subject: str, reason: str
) -> None:
    assert _send(node, subject) == (451, b"4.3.0 policy error; try again later")
    # The node is shared by the cases: wait for this one's record (written a moment after the reply).
    wait_until(lambda: any(reason in f["error"] for f in node.records("PolicyFailure")))
    failures = [f for f in node.records("PolicyFailure") if reason in f["error"]]
    assert failures[0]["hook"] == "on_message" and failures[0]["action"] == "451 4.3.0"
    assert failures[0]["error"].startswith("ValueError: queue ")
    assert len(failures[0]["error"]) < 300  # a long name is cut short in the record
    assert not [m for m in node.spool_messages() if m["recipients"] == [f"{subject}@example.net"]]


def test_a_well_formed_queue_name_from_the_policy_is_taken(node: PigeonProcess) -> None:
    assert _send(node, "good")[0] == 250
    (stored,) = [m for m in node.spool_messages() if m["recipients"] == ["good@example.net"]]
    assert stored["queue"] == "vip:acme@example.net"
