"""A recipient one MX host answers 4xx is tried at once at the domain's next MX host, in the
same attempt (`[delivery] try_next_mx`), within the site's connection limit."""

from __future__ import annotations

import json
import smtplib
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.dns import DnsServer, Zone
from tests.support.process import PigeonProcess, free_port
from tests.support.sinks import ScriptedSink, SinkConnection, peak_connections

GREYLISTED = "451 4.7.1 greylisted, try again later"


def _zone(*hosts: str) -> Zone:
    """example.net's MX hosts mx1, mx2, ... in that order of preference, at `hosts`."""
    records: dict[str, list[tuple[object, ...]]] = {
        "example.net": [("MX", 10 * n, f"mx{n}.example.net") for n in range(1, len(hosts) + 1)]
    }
    for n, address in enumerate(hosts, 1):
        records[f"mx{n}.example.net"] = [("A", address)]
    return Zone(records)


@contextmanager
def _node(
    tmp_path: Path,
    dns: DnsServer,
    port: int,
    reaction: list[dict[str, str]] | None = None,
    policy: dict[str, str] | None = None,
    **delivery: object,
) -> Iterator[PigeonProcess]:
    settings = {
        "enabled": True,
        "smtp_port": port,
        "retry_interval": "30s",  # nothing in these tests is retried on the schedule
        "dsn": False,
        "tls": "disabled",
        "connection_limit": 1,
        **delivery,
    }
    dns_settings = {"nameservers": [dns.endpoint], "timeout": "1s"}
    sections: dict[str, object] = {"reaction": reaction or []}
    if policy is not None:
        sections["policy"] = policy
    with PigeonProcess(tmp_path / "node", delivery=settings, dns=dns_settings, **sections) as pigeon:
        yield pigeon


def _send(pigeon: PigeonProcess, *recipients: str) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.sendmail("a@example.org", list(recipients), b"Subject: next mx\r\n\r\nhi\r\n")


def _sessions(sink: ScriptedSink) -> list[SinkConnection]:
    """The sink's connections from Pigeon: all but the first, aiosmtpd's own readiness probe
    when the sink started."""
    return sink.connections[1:]


def _by_recipient(records: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    return {r["recipient"]: r for r in records}


def test_a_recipient_greylisted_at_the_first_mx_is_delivered_at_the_next_in_the_same_attempt(tmp_path: Path) -> None:
    port = free_port()
    with (
        DnsServer(_zone("127.0.0.2", "127.0.0.3")) as dns,
        ScriptedSink(host="127.0.0.2", port=port) as mx1,
        ScriptedSink(host="127.0.0.3", port=port) as mx2,
        _node(tmp_path, dns, port) as pigeon,
    ):
        mx1.rcpt_reply = lambda address: GREYLISTED if address.startswith("grey") else None
        _send(pigeon, "ok@example.net", "grey@example.net", "grey2@example.net")
        records = _by_recipient(pigeon.wait_records("Delivery", 3))
        assert not pigeon.records("TransientFailure")
        assert {r["attempt"] for r in records.values()} == {1}
        assert records["ok@example.net"]["peer"] == f"mx1.example.net [127.0.0.2]:{port}"
        assert records["grey@example.net"]["peer"] == f"mx2.example.net [127.0.0.3]:{port}"
        assert records["grey2@example.net"]["peer"] == f"mx2.example.net [127.0.0.3]:{port}"
        assert [m.recipients for m in mx1.received] == [["ok@example.net"]]
        assert [m.recipients for m in mx2.received] == [["grey@example.net", "grey2@example.net"]]
        # connection_limit = 1: the connection to mx1 ended before the one to mx2 opened.
        assert peak_connections(_sessions(mx1) + _sessions(mx2)) == 1


def test_each_host_s_4xx_moves_the_delivery_to_the_other_within_the_connection_limit(tmp_path: Path) -> None:
    port = free_port()
    with (
        DnsServer(_zone("127.0.0.2", "127.0.0.3")) as dns,
        ScriptedSink(host="127.0.0.2", port=port) as mx1,
        ScriptedSink(host="127.0.0.3", port=port) as mx2,
        _node(tmp_path, dns, port) as pigeon,
    ):
        mx1.rcpt_reply = lambda address: GREYLISTED if address.startswith("grey") else None
        mx2.rcpt_reply = lambda address: GREYLISTED if address.startswith("busy") else None
        recipients = [f"{('grey', 'busy', 'ok')[n % 3]}{n}@example.net" for n in range(12)]
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            for recipient in recipients:  # each refused by one host, or by none, mixed
                client.sendmail("a@example.org", [recipient], b"Subject: n\r\n\r\nhi\r\n")
        delivered = _by_recipient(pigeon.wait_records("Delivery", 12))
        assert sorted(delivered) == sorted(recipients)
        assert not pigeon.records("TransientFailure")
        assert {r["attempt"] for r in delivered.values()} == {1}
        for recipient, record in delivered.items():
            if recipient.startswith("grey"):
                assert record["peer"] == f"mx2.example.net [127.0.0.3]:{port}"
            if recipient.startswith("busy"):
                assert record["peer"] == f"mx1.example.net [127.0.0.2]:{port}"
        received = [rcpt for m in mx1.received + mx2.received for rcpt in m.recipients]
        assert sorted(received) == sorted(recipients)  # each once
        assert peak_connections(_sessions(mx1) + _sessions(mx2)) == 1


def test_a_recipient_deferred_at_every_mx_counts_one_attempt_and_names_the_last_host(tmp_path: Path) -> None:
    port = free_port()
    with (
        DnsServer(_zone("127.0.0.2", "127.0.0.3", "127.0.0.4")) as dns,
        ScriptedSink(host="127.0.0.2", port=port) as mx1,
        ScriptedSink(host="127.0.0.3", port=port) as mx2,
        ScriptedSink(host="127.0.0.4", port=port) as mx3,
        _node(tmp_path, dns, port) as pigeon,
    ):
        _send(pigeon, "tempfail@example.net", "ok@example.net")
        (failure,) = pigeon.wait_records("TransientFailure")
        (delivery,) = pigeon.wait_records("Delivery")
        assert (failure["recipient"], failure["attempt"]) == ("tempfail@example.net", 1)
        assert failure["peer"] == f"mx2.example.net [127.0.0.3]:{port}"  # one other host per attempt
        assert delivery["peer"] == f"mx1.example.net [127.0.0.2]:{port}"
        assert mx1.rcpt_log.count("tempfail@example.net") == mx2.rcpt_log.count("tempfail@example.net") == 1
        assert not _sessions(mx3)
        assert "ok@example.net" not in mx2.rcpt_log


def test_with_try_next_mx_off_a_4xx_waits_for_its_retry(tmp_path: Path) -> None:
    port = free_port()
    with (
        DnsServer(_zone("127.0.0.2", "127.0.0.3")) as dns,
        ScriptedSink(host="127.0.0.2", port=port) as mx1,
        ScriptedSink(host="127.0.0.3", port=port) as mx2,
        _node(tmp_path, dns, port, try_next_mx=False) as pigeon,
    ):
        mx1.rcpt_reply = lambda address: GREYLISTED if address.startswith("grey") else None
        _send(pigeon, "grey@example.net")
        (failure,) = pigeon.wait_records("TransientFailure")
        assert failure["peer"] == f"mx1.example.net [127.0.0.2]:{port}"
        assert failure["response"]["text"] == "greylisted, try again later"
        assert not _sessions(mx2)


def test_a_next_mx_that_takes_no_connection_leaves_the_4xx_and_the_site_up(tmp_path: Path) -> None:
    port = free_port()  # nothing listens at mx2 (127.0.0.3)
    with (
        DnsServer(_zone("127.0.0.2", "127.0.0.3")) as dns,
        ScriptedSink(host="127.0.0.2", port=port) as mx1,
        _node(tmp_path, dns, port) as pigeon,
    ):
        mx1.rcpt_reply = lambda address: GREYLISTED if address.startswith("grey") else None
        _send(pigeon, "grey@example.net")
        (failure,) = pigeon.wait_records("TransientFailure")
        assert failure["peer"] == f"mx1.example.net [127.0.0.2]:{port}"
        assert failure["response"]["enhanced"] == "4.7.1"
        _send(pigeon, "ok@example.net")  # the site is not down: the next message goes at once
        (delivery,) = pigeon.wait_records("Delivery")
        assert delivery["peer"] == f"mx1.example.net [127.0.0.2]:{port}"
        assert len(pigeon.records("TransientFailure")) == 1  # nothing deferred "not tried: ... is down"


def test_on_the_last_mx_a_4xx_goes_back_to_no_host_before_it(tmp_path: Path) -> None:
    # mx1 is down, so the connection went to mx2; a 4xx there is final for this attempt: mx1
    # was passed over moments ago, and trying it again would cost each such message a
    # connection that fails.
    port = free_port()
    with (
        DnsServer(_zone("127.0.0.2", "127.0.0.3")) as dns,
        ScriptedSink(host="127.0.0.3", port=port) as mx2,
        _node(tmp_path, dns, port) as pigeon,
    ):
        mx2.rcpt_reply = lambda address: GREYLISTED if address.startswith("grey") else None
        _send(pigeon, "grey@example.net", "ok@example.net")
        (failure,) = pigeon.wait_records("TransientFailure")
        (delivery,) = pigeon.wait_records("Delivery")
        assert failure["peer"] == delivery["peer"] == f"mx2.example.net [127.0.0.3]:{port}"
        _send(pigeon, "ok2@example.net")
        pigeon.wait_records("Delivery", 2)
        assert len(_sessions(mx2)) == 1  # still the connection it opened: it never left for mx1


def test_a_4xx_got_past_at_the_next_mx_still_reaches_the_shaping_reactions(tmp_path: Path) -> None:
    # A provider's "slow down" at one of its MX hosts is the site's word, even when the next
    # host took the recipient.
    port = free_port()
    rule = {"id": "greylisting", "match": r"^451 4\.7\.1 greylisted", "action": "suspend", "duration": "1m"}
    with (
        DnsServer(_zone("127.0.0.2", "127.0.0.3")) as dns,
        ScriptedSink(host="127.0.0.2", port=port) as mx1,
        ScriptedSink(host="127.0.0.3", port=port),
        _node(tmp_path, dns, port, reaction=[rule]) as pigeon,
    ):
        mx1.rcpt_reply = lambda address: GREYLISTED if address.startswith("grey") else None
        _send(pigeon, "grey@example.net")
        (delivery,) = pigeon.wait_records("Delivery")
        (effect,) = pigeon.wait_records("ShapingEffect")
        assert delivery["peer"] == f"mx2.example.net [127.0.0.3]:{port}"
        assert (effect["event"], effect["rule"], effect["action"]) == ("created", "greylisting", "suspend")
        assert effect["reply"].startswith(GREYLISTED)


def test_mail_the_next_mx_cannot_take_goes_back_to_the_first_rather_than_bouncing(tmp_path: Path) -> None:
    # Hosts of one site need not offer the same: after a 4xx moved the delivery to mx2, a
    # message needing SMTPUTF8, which only mx1 offers, goes back to mx1.
    port = free_port()

    def greylist_slowly(address: str) -> str | None:
        if address.startswith("grey"):
            time.sleep(0.5)  # the next message is queued behind this one, for the same connection
        return None

    with (
        DnsServer(_zone("127.0.0.2", "127.0.0.3")) as dns,
        ScriptedSink(host="127.0.0.2", port=port, smtputf8=True) as mx1,
        ScriptedSink(host="127.0.0.3", port=port) as mx2,
        _node(tmp_path, dns, port) as pigeon,
    ):
        mx1.rcpt_reply = lambda address: GREYLISTED if address.startswith("grey") else None
        mx2.rcpt_reply = greylist_slowly
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["grey@example.net"], b"Subject: 1\r\n\r\nhi\r\n")
            message = b"Subject: 2\r\n\r\nhi\r\n"
            client.sendmail("a@example.org", ["jörg@example.net"], message, mail_options=["SMTPUTF8"])
        delivered = _by_recipient(pigeon.wait_records("Delivery", 2))
        assert not pigeon.records("Bounce")
        assert delivered["grey@example.net"]["peer"] == f"mx2.example.net [127.0.0.3]:{port}"
        assert delivered["jörg@example.net"]["peer"] == f"mx1.example.net [127.0.0.2]:{port}"
        assert delivered["jörg@example.net"]["attempt"] == 1
        assert peak_connections(_sessions(mx1) + _sessions(mx2)) == 1
        assert len(_sessions(mx1)) == 2  # the same delivery went back: mx1, mx2, mx1 again


OUTCOME_POLICY = """
    import json
    def on_delivery_outcome(outcome):
        with open(__file__ + ".seen", "a") as seen:
            for result in outcome.results:
                seen.write(json.dumps([outcome.peer, result.recipient, result.status, result.peer]) + "\\n")
"""


def test_the_delivery_outcome_hook_sees_which_host_answered_each_recipient(tmp_path: Path) -> None:
    port = free_port()
    module = tmp_path / "outcome_policy.py"
    module.write_text(textwrap.dedent(OUTCOME_POLICY))
    with (
        DnsServer(_zone("127.0.0.2", "127.0.0.3")) as dns,
        ScriptedSink(host="127.0.0.2", port=port) as mx1,
        ScriptedSink(host="127.0.0.3", port=port),
        _node(tmp_path, dns, port, policy={"module": str(module)}) as pigeon,
    ):
        mx1.rcpt_reply = lambda address: GREYLISTED if address.startswith("grey") else None
        _send(pigeon, "ok@example.net", "grey@example.net")
        pigeon.wait_records("Delivery", 2)
        seen = [json.loads(line) for line in (tmp_path / "outcome_policy.py.seen").read_text().splitlines()]
    first, second = f"mx1.example.net [127.0.0.2]:{port}", f"mx2.example.net [127.0.0.3]:{port}"
    assert sorted(seen) == [
        [first, "grey@example.net", "delivered", second],
        [first, "ok@example.net", "delivered", first],
    ]
