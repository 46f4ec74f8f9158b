"""A recipient one MX host answers 4xx is tried at once at the domain's next MX host, in the
same attempt (`[delivery] try_next_mx = true`, off by default), within the site's connection limit."""

from __future__ import annotations

import contextlib
import json
import smtplib
import socket
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.dns import DnsServer, Zone
from tests.support.process import PigeonProcess, free_port
from tests.support.sinks import AnswerSink, ScriptedSink, SinkConnection, peak_connections, wait_until

GREYLISTED = "451 4.7.1 greylisted, try again later"


@dataclass
class _Site:
    """example.net, whose MX hosts mx1, mx2, ... (in that order of preference) are at
    127.0.0.2, 127.0.0.3, ...; `mx[n]` is mx<n>'s sink, if one listens there."""

    port: int
    mx: dict[int, ScriptedSink]
    pigeon: PigeonProcess

    def peer(self, n: int) -> str:
        """How the records name mx<n>."""
        return f"mx{n}.example.net [127.0.0.{n + 1}]:{self.port}"

    def sessions(self, *hosts: int) -> list[SinkConnection]:
        """The connections Pigeon made to these hosts: all but the first of each sink, which
        was aiosmtpd's own readiness probe when it started."""
        return [c for n in hosts for c in self.mx[n].connections[1:]]


@contextmanager
def _site(
    tmp_path: Path,
    hosts: int = 2,
    *,
    down: tuple[int, ...] = (),
    smtputf8: tuple[int, ...] = (),
    greylisting: tuple[int, ...] = (1,),
    sections: dict[str, object] | None = None,
    **delivery: object,
) -> Iterator[_Site]:
    """`hosts` MX hosts, those `down` with nothing listening; those `greylisting` answer
    GREYLISTED to recipients named grey*; Pigeon with `connection_limit = 1` and `delivery`."""
    records: dict[str, list[tuple[object, ...]]] = {
        "example.net": [("MX", 10 * n, f"mx{n}.example.net") for n in range(1, hosts + 1)]
    }
    records.update({f"mx{n}.example.net": [("A", f"127.0.0.{n + 1}")] for n in range(1, hosts + 1)})
    port = free_port()
    settings = {
        "enabled": True,
        "smtp_port": port,
        "retry_interval": "30s",  # nothing in these tests is retried on the schedule
        "dsn": False,
        "tls": "disabled",
        "connection_limit": 1,
        "try_next_mx": True,
        **delivery,
    }
    with ExitStack() as stack:
        dns = stack.enter_context(DnsServer(Zone(records)))
        mx = {}
        for n in range(1, hosts + 1):
            if n not in down:
                sink = ScriptedSink(host=f"127.0.0.{n + 1}", port=port, smtputf8=n in smtputf8)
                mx[n] = stack.enter_context(sink)
                if n in greylisting:
                    sink.rcpt_reply = lambda address: GREYLISTED if address.startswith("grey") else None
        dns_settings = {"nameservers": [dns.endpoint], "timeout": "1s"}
        pigeon = PigeonProcess(tmp_path / "node", delivery=settings, dns=dns_settings, **(sections or {}))
        yield _Site(port, mx, stack.enter_context(pigeon))


def _send(pigeon: PigeonProcess, *recipients: str) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.sendmail("a@example.org", list(recipients), b"Subject: next mx\r\n\r\nhi\r\n")


def _by_recipient(records: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    return {r["recipient"]: r for r in records}


def test_a_recipient_greylisted_at_the_first_mx_is_delivered_at_the_next_in_the_same_attempt(tmp_path: Path) -> None:
    with _site(tmp_path) as site:
        _send(site.pigeon, "ok@example.net", "grey@example.net", "grey2@example.net")
        records = _by_recipient(site.pigeon.wait_records("Delivery", 3))
        assert not site.pigeon.records("TransientFailure")
        assert {r["attempt"] for r in records.values()} == {1}
        assert records["ok@example.net"]["peer"] == site.peer(1)
        assert records["grey@example.net"]["peer"] == records["grey2@example.net"]["peer"] == site.peer(2)
        assert [m.recipients for m in site.mx[1].received] == [["ok@example.net"]]
        assert [m.recipients for m in site.mx[2].received] == [["grey@example.net", "grey2@example.net"]]
        # connection_limit = 1: the connection to mx1 ended before the one to mx2 opened.
        assert peak_connections(site.sessions(1, 2)) == 1


def test_each_host_s_4xx_moves_the_delivery_to_the_other_within_the_connection_limit(tmp_path: Path) -> None:
    with _site(tmp_path) as site:
        site.mx[2].rcpt_reply = lambda address: GREYLISTED if address.startswith("busy") else None
        recipients = [f"{('grey', 'busy', 'ok')[n % 3]}{n}@example.net" for n in range(12)]
        with smtplib.SMTP("127.0.0.1", site.pigeon.smtp_port) as client:
            for recipient in recipients:  # each refused by one host, or by none, mixed
                client.sendmail("a@example.org", [recipient], b"Subject: n\r\n\r\nhi\r\n")
        delivered = _by_recipient(site.pigeon.wait_records("Delivery", 12))
        assert sorted(delivered) == sorted(recipients)
        assert not site.pigeon.records("TransientFailure")
        assert {r["attempt"] for r in delivered.values()} == {1}
        for recipient, record in delivered.items():
            if recipient.startswith("grey"):
                assert record["peer"] == site.peer(2)
            if recipient.startswith("busy"):
                assert record["peer"] == site.peer(1)
        received = [rcpt for n in (1, 2) for m in site.mx[n].received for rcpt in m.recipients]
        assert sorted(received) == sorted(recipients)  # each once
        assert peak_connections(site.sessions(1, 2)) == 1


def test_a_recipient_deferred_at_every_mx_counts_one_attempt_and_names_the_last_host(tmp_path: Path) -> None:
    with _site(tmp_path, 3, greylisting=()) as site:
        _send(site.pigeon, "tempfail@example.net", "ok@example.net")
        (failure,) = site.pigeon.wait_records("TransientFailure")
        (delivery,) = site.pigeon.wait_records("Delivery")
        assert (failure["recipient"], failure["attempt"]) == ("tempfail@example.net", 1)
        assert failure["peer"] == site.peer(2)  # one other host per attempt
        assert delivery["peer"] == site.peer(1)
        assert [site.mx[n].rcpt_log.count("tempfail@example.net") for n in (1, 2)] == [1, 1]
        assert not site.sessions(3)
        assert "ok@example.net" not in site.mx[2].rcpt_log


def test_with_try_next_mx_off_as_by_default_a_4xx_waits_for_its_retry(tmp_path: Path) -> None:
    with _site(tmp_path, try_next_mx=False) as site:
        _send(site.pigeon, "grey@example.net")
        (failure,) = site.pigeon.wait_records("TransientFailure")
        assert failure["peer"] == site.peer(1)
        assert failure["response"]["text"] == "greylisted, try again later"
        assert not site.sessions(2)


def test_a_next_mx_that_takes_no_connection_leaves_the_4xx_and_the_site_up(tmp_path: Path) -> None:
    with _site(tmp_path, down=(2,)) as site:
        _send(site.pigeon, "grey@example.net")
        (failure,) = site.pigeon.wait_records("TransientFailure")
        assert failure["peer"] == site.peer(1)
        assert failure["response"]["enhanced"] == "4.7.1"
        _send(site.pigeon, "ok@example.net")  # the site is not down: the next message goes at once
        (delivery,) = site.pigeon.wait_records("Delivery")
        assert delivery["peer"] == site.peer(1)
        assert len(site.pigeon.records("TransientFailure")) == 1  # nothing deferred "not tried: ... is down"


def test_recipients_the_next_mx_took_after_a_failed_handshake_say_so_and_the_others_do_not(tmp_path: Path) -> None:
    """Each record names the TLS its own host's connection had: mx2's, opened in the clear
    after its STARTTLS handshake failed, has `tls_failed`; mx1's, which offers no STARTTLS, not."""
    with (
        _site(tmp_path, down=(2,), tls="opportunistic") as site,
        AnswerSink(extensions=("STARTTLS",), host="127.0.0.3", port=site.port),
    ):
        _send(site.pigeon, "ok@example.net", "grey@example.net")
        records = _by_recipient(site.pigeon.wait_records("Delivery", 2))
    assert records["ok@example.net"]["peer"] == site.peer(1) and "tls_failed" not in records["ok@example.net"]
    grey = records["grey@example.net"]
    assert grey["peer"] == site.peer(2) and grey.get("tls") is None
    assert str(grey.get("tls_failed", "")).startswith(f"TLS handshake with {site.peer(2)} failed: "), grey


def test_on_the_last_mx_a_4xx_goes_back_to_no_host_before_it(tmp_path: Path) -> None:
    # mx1 is down, so the connection went to mx2; a 4xx there is final for this attempt: mx1
    # was passed over moments ago, and trying it again would cost each such message a
    # connection that fails.
    with _site(tmp_path, down=(1,), greylisting=(2,)) as site:
        _send(site.pigeon, "grey@example.net", "ok@example.net")
        (failure,) = site.pigeon.wait_records("TransientFailure")
        (delivery,) = site.pigeon.wait_records("Delivery")
        assert failure["peer"] == delivery["peer"] == site.peer(2)
        _send(site.pigeon, "ok2@example.net")
        site.pigeon.wait_records("Delivery", 2)
        assert len(site.sessions(2)) == 1  # still the connection it opened: it never left for mx1


def test_a_4xx_got_past_at_the_next_mx_still_reaches_the_shaping_reactions(tmp_path: Path) -> None:
    # A provider's "slow down" at one of its MX hosts is the site's word, even when the next
    # host took the recipient.
    rule = {"id": "greylisting", "match": r"^451 4\.7\.1 greylisted", "action": "suspend", "duration": "1m"}
    with _site(tmp_path, sections={"reaction": [rule]}) as site:
        _send(site.pigeon, "grey@example.net")
        (delivery,) = site.pigeon.wait_records("Delivery")
        (effect,) = site.pigeon.wait_records("ShapingEffect")
        assert delivery["peer"] == site.peer(2)
        assert (effect["event"], effect["rule"], effect["action"]) == ("created", "greylisting", "suspend")
        assert effect["reply"].startswith(GREYLISTED)


@pytest.mark.parametrize("second", [["jörg@example.net"], ["ok@example.net", "jörg@example.net"]], ids=["one", "mixed"])
def test_mail_the_next_mx_cannot_take_goes_back_to_the_first_rather_than_bouncing(
    tmp_path: Path, second: list[str]
) -> None:
    # Hosts of one site need not offer the same: after a 4xx moved the delivery to mx2, a
    # message needing SMTPUTF8, which only mx1 offers, goes back to mx1. With an ASCII
    # recipient too, all of it does: mx2 would have refused jörg alone, but mx1 takes both.
    def slowly(address: str) -> str | None:
        time.sleep(0.5)  # the next message is queued behind this one, for the same connection
        return None

    with _site(tmp_path, smtputf8=(1,)) as site:
        site.mx[2].rcpt_reply = slowly
        with smtplib.SMTP("127.0.0.1", site.pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["grey@example.net"], b"Subject: 1\r\n\r\nhi\r\n")
            message = b"Subject: 2\r\n\r\nhi\r\n"
            client.sendmail("a@example.org", second, message, mail_options=["SMTPUTF8"])
        delivered = _by_recipient(site.pigeon.wait_records("Delivery", 1 + len(second)))
        assert not site.pigeon.records("Bounce")
        assert delivered["grey@example.net"]["peer"] == site.peer(2)
        for recipient in second:
            assert delivered[recipient]["peer"] == site.peer(1)
            assert delivered[recipient]["attempt"] == 1
        assert peak_connections(site.sessions(1, 2)) == 1
        assert len(site.sessions(1)) == 2  # the same delivery went back: mx1, mx2, mx1 again


def test_at_a_next_mx_without_smtputf8_the_ascii_recipients_go_and_the_others_keep_their_4xx(
    tmp_path: Path,
) -> None:
    # mx1 offers SMTPUTF8 and greylists both; mx2 lacks it. greyé needs it (RCPT has no other
    # form), so it waits for mx1 again rather than bouncing; grey has no need of it, nor of
    # waiting for greyé: it is delivered at mx2 in the same attempt.
    with _site(tmp_path, smtputf8=(1,)) as site:
        with smtplib.SMTP("127.0.0.1", site.pigeon.smtp_port) as client:
            message = b"Subject: mixed\r\n\r\nhi\r\n"
            client.sendmail("a@example.org", ["grey@example.net", "greyé@example.net"], message, ["SMTPUTF8"])
        (delivery,) = site.pigeon.wait_records("Delivery")
        (deferred,) = site.pigeon.wait_records("TransientFailure")
        assert (delivery["recipient"], delivery["peer"], delivery["attempt"]) == ("grey@example.net", site.peer(2), 1)
        assert (deferred["recipient"], deferred["peer"]) == ("greyé@example.net", site.peer(1))
        assert deferred["response"]["text"].startswith("greylisted")
        assert [m.recipients for m in site.mx[2].received] == [["grey@example.net"]]
        assert "SMTPUTF8" not in site.mx[2].received[0].mail_options
        assert site.pigeon.records("Bounce") == []


OUTCOME_POLICY = """
    import json
    def on_delivery_outcome(outcome):
        with open(__file__ + ".seen", "a") as seen:
            for result in outcome.results:
                seen.write(json.dumps([outcome.peer, result.recipient, result.status, result.peer]) + "\\n")
"""


def test_the_delivery_outcome_hook_sees_which_host_answered_each_recipient(tmp_path: Path) -> None:
    module = tmp_path / "outcome_policy.py"
    module.write_text(textwrap.dedent(OUTCOME_POLICY))
    with _site(tmp_path, sections={"policy": {"module": str(module)}}) as site:
        _send(site.pigeon, "ok@example.net", "grey@example.net")
        site.pigeon.wait_records("Delivery", 2)
        seen = [json.loads(line) for line in (tmp_path / "outcome_policy.py.seen").read_text().splitlines()]
        assert sorted(seen) == [
            [site.peer(1), "grey@example.net", "delivered", site.peer(2)],
            [site.peer(1), "ok@example.net", "delivered", site.peer(1)],
        ]


@pytest.mark.parametrize("chunking", [False, True])
def test_a_421_that_ends_the_session_at_rcpt_sends_the_message_to_the_next_mx(tmp_path: Path, chunking: bool) -> None:
    # A busy server's "421 try later, closing" at a RCPT: its own words, a definite no (no
    # transaction was completed), so the next host may have the message at once. With
    # CHUNKING too, though BDAT LAST went out with the RCPTs: the 421 came before its reply
    # (RFC 2920 3.1), so the server took no message, and none "may be delivered twice".
    with _site(tmp_path, down=(1,), greylisting=()) as site:
        busy = _Busy("127.0.0.2", site.port, chunking=chunking)
        try:
            _send(site.pigeon, "a1@example.net", "qq2@example.net", "a3@example.net")
            delivered = _by_recipient(site.pigeon.wait_records("Delivery", 3))
        finally:
            busy.close()
        assert {record["peer"] for record in delivered.values()} == {site.peer(2)}
        assert [sorted(m.recipients) for m in site.mx[2].received] == [sorted(delivered)]
        assert busy.said_421 == 1
        assert "delivered twice" not in site.pigeon.stderr()


def test_a_stop_while_the_next_mx_is_tried_keeps_what_the_first_took(tmp_path: Path) -> None:
    # mx1 took ok@ and deferred grey@; the node stops while mx2 has not answered yet. The
    # restarted node must not send ok@ again.
    def stalls(address: str) -> str | None:
        time.sleep(5)
        return None

    with _site(tmp_path, sections={"node": {"shutdown_timeout": "1s"}}) as site:
        site.mx[2].rcpt_reply = stalls
        _send(site.pigeon, "ok@example.net", "grey@example.net")
        site.mx[1].wait_for(1)
        time.sleep(0.3)  # on its way to mx2
        site.pigeon.stop()
        (delivery,) = site.pigeon.records("Delivery")
        assert (delivery["recipient"], delivery["peer"]) == ("ok@example.net", site.peer(1))
        site.mx[2].rcpt_reply = None
        site.pigeon.start()
        time.sleep(1.5)
        assert [m.recipients for m in site.mx[1].received] == [["ok@example.net"]]  # once
        assert [r["recipient"] for r in site.pigeon.records("Delivery")] == ["ok@example.net"]


def test_a_stop_while_the_next_mx_holds_its_end_of_data_reply_says_the_message_may_come_twice(
    tmp_path: Path,
) -> None:
    # mx1 took ok@ and deferred slowend-1@; mx2 has the content and holds its reply past the
    # stop: slowend-1@ may be delivered twice, and its record and a WARNING say so.
    with _site(tmp_path, sections={"node": {"shutdown_timeout": "1s"}}) as site:
        site.mx[1].rcpt_reply = lambda address: GREYLISTED if address.startswith("slowend") else None
        site.mx[2].slow = 5.0
        _send(site.pigeon, "ok@example.net", "slowend-1@example.net")
        wait_until(lambda: "slowend-1@example.net" in site.mx[2].rcpt_log)
        time.sleep(0.5)  # the content on its way, its reply held
        assert site.pigeon.stop() == 0
        (delivery,) = site.pigeon.records("Delivery")
        assert (delivery["recipient"], delivery["peer"]) == ("ok@example.net", site.peer(1))
        (failure,) = site.pigeon.records("TransientFailure")
        assert (failure["recipient"], failure["peer"], failure["attempt"]) == ("slowend-1@example.net", site.peer(2), 1)
        assert failure["response"]["text"].endswith("no reply to the end of data: the message may be delivered twice")
        assert "answered the end of data: slowend-1@example.net may be delivered twice" in site.pigeon.stderr()


def test_a_stop_in_a_later_transaction_at_the_next_mx_keeps_what_its_earlier_one_took(tmp_path: Path) -> None:
    # mx1 defers both; mx2 takes one recipient a transaction: grey@ is stored (250), then
    # slowend-1@'s end of data is held past the stop. grey@ is delivered (not sent again at
    # restart); only slowend-1@ may come twice, and its record says so.
    with _site(tmp_path, sections={"node": {"shutdown_timeout": "1s"}}) as site:
        site.mx[1].rcpt_reply = lambda address: GREYLISTED if address.startswith(("grey", "slowend")) else None
        site.mx[2].max_recipients = 1
        site.mx[2].slow = 5.0
        _send(site.pigeon, "grey@example.net", "slowend-1@example.net")
        wait_until(lambda: bool(site.mx[2].received) and "slowend-1@example.net" in site.mx[2].rcpt_log[2:])
        time.sleep(0.5)  # the second transaction's content on its way, its reply held
        assert site.pigeon.stop() == 0
        assert [m.recipients for m in site.mx[2].received] == [["grey@example.net"]]
        (delivery,) = site.pigeon.records("Delivery")
        assert (delivery["recipient"], delivery["peer"]) == ("grey@example.net", site.peer(2))
        (failure,) = site.pigeon.records("TransientFailure")
        assert (failure["recipient"], failure["peer"]) == ("slowend-1@example.net", site.peer(2))
        assert failure["response"]["text"].endswith("the message may be delivered twice")
        assert "answered the end of data: slowend-1@example.net may be delivered twice" in site.pigeon.stderr()


def test_a_stop_before_a_later_transaction_s_content_at_the_next_mx_keeps_what_its_earlier_one_took(
    tmp_path: Path,
) -> None:
    # As above, but mx2 holds its answer to the second transaction's RCPT: its content never
    # went, so slow-1@ is simply deferred (no note), and grey@, which mx2 took, is delivered.
    with _site(tmp_path, sections={"node": {"shutdown_timeout": "1s"}}) as site:
        site.mx[1].rcpt_reply = lambda address: GREYLISTED if address.startswith(("grey", "slow")) else None
        site.mx[2].max_recipients = 1
        site.mx[2].slow = 5.0
        _send(site.pigeon, "grey@example.net", "slow-1@example.net")
        wait_until(lambda: bool(site.mx[2].received) and "slow-1@example.net" in site.mx[2].rcpt_log[2:])
        time.sleep(0.5)  # its RCPT unanswered
        assert site.pigeon.stop() == 0
        assert [m.recipients for m in site.mx[2].received] == [["grey@example.net"]]
        (delivery,) = site.pigeon.records("Delivery")
        assert (delivery["recipient"], delivery["peer"]) == ("grey@example.net", site.peer(2))
        (failure,) = site.pigeon.records("TransientFailure")
        assert failure["recipient"] == "slow-1@example.net"
        assert "delivered twice" not in failure["response"]["text"]
        assert "may be delivered twice" not in site.pigeon.stderr()


class _Busy:
    """A host that greets, then answers a RCPT for qq* with 421 and hangs up."""

    def __init__(self, host: str, port: int, *, chunking: bool = False) -> None:
        self.said_421 = 0
        self.chunking = chunking  # offered with PIPELINING: BDAT LAST goes with the RCPTs
        self._server = socket.create_server((host, port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                connection = self._server.accept()[0]
                threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as lines:
            connection.sendall(b"220 busy.example.net ESMTP\r\n")
            for line in lines:
                command = line.upper()
                if command.startswith(b"EHLO"):
                    chunking = b"250-CHUNKING\r\n" if self.chunking else b""
                    connection.sendall(b"250-busy.example.net\r\n" + chunking + b"250 PIPELINING\r\n")
                elif command.startswith(b"RCPT TO:<QQ"):
                    self.said_421 += 1
                    connection.sendall(b"421 4.3.2 too busy, closing\r\n")
                    return
                elif command.startswith(b"QUIT"):
                    connection.sendall(b"221 bye\r\n")
                    return
                else:
                    connection.sendall(b"250 ok\r\n")

    def close(self) -> None:
        self._server.close()


class _Mute:
    """A host that takes TCP connections and never says a word (counts them)."""

    def __init__(self, host: str, port: int) -> None:
        self.accepted: list[socket.socket] = []
        self._server = socket.create_server((host, port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.accepted.append(self._server.accept()[0])

    def close(self) -> None:
        self._server.close()
        for connection in self.accepted:
            connection.close()


def test_a_next_mx_that_never_greets_costs_one_message_the_connect_timeout_then_is_left_alone(
    tmp_path: Path,
) -> None:
    with _site(tmp_path, down=(2,), connect_timeout="1s") as site:
        mute = _Mute("127.0.0.3", site.port)
        try:
            _send(site.pigeon, "grey1@example.net")
            started = time.monotonic()
            site.pigeon.wait_records("TransientFailure")
            assert time.monotonic() - started < 5  # the connect timeout, not 5 minutes of reply timeout
            for n in (2, 3):
                _send(site.pigeon, f"grey{n}@example.net")
            failures = site.pigeon.wait_records("TransientFailure", 3)
            assert {f["peer"] for f in failures} == {site.peer(1)}
            assert len(mute.accepted) == 1  # the site's next host is left alone for a while
            assert "no next MX host took a connection" in site.pigeon.stderr()
        finally:
            mute.close()
