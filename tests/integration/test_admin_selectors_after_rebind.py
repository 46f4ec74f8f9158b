"""Admin selectors after mail was moved: `tenant`, `campaign` and `domain` name the queue a
message is in now (`campaign:tenant@domain`, as KumoMTA's do), not the one it arrived in.

The operator's workflow: move the VIP mail out of campaign ca into campaign cb, then suspend
campaign cb (it holds that mail: nothing reaches the next hop until resumed) and bounce campaign
ca (the moved mail is not ca's any more: not bounced). Before, both selectors matched the
envelope's old tenant and campaign: the suspension held 0 and the mail was delivered under it,
and the bounce of ca bounced the mail moved out of it. A policy's `Changes(queue=...)` moves
mail at reception the same way.
"""

from __future__ import annotations

import smtplib
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

ADMIN = "admin-token-0123456789"
TOKENS = [{"name": "ops", "token": ADMIN, "scopes": ["admin", "read"]}]


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    # flaky@: refused at its first two tries (at reception, then once rebound), taken at the third.
    with ScriptedSink(flaky=2) as running:
        yield running


def _node(root: Path, sink: ScriptedSink, **sections: Any) -> PigeonProcess:
    config = delivery_config(sink.endpoint, retry_interval="1h")
    return PigeonProcess(root, http={"token": TOKENS}, **config, **sections)


def _send(pigeon: PigeonProcess, recipient: str, headers: str) -> str:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        client.mail("sender@example.org")
        client.rcpt(recipient)
        code, text = client.data(f"{headers}Subject: x\r\n\r\nhello\r\n".encode())
        assert code == 250, text
        (spool_id,) = text.decode().split("queued as ")[1].split()
        return spool_id


def _api(pigeon: PigeonProcess, method: str, path: str, body: Any = None) -> Any:
    status, answer = pigeon.http_call(method, path, body, ADMIN)
    assert status == 200, (path, body, answer)
    return answer


def _settled(pigeon: PigeonProcess, failures: int) -> None:
    """Until `failures` attempts failed and none is still being written: all waits in the spool."""
    wait_until(lambda: len(pigeon.records("TransientFailure")) == failures)
    wait_until(
        lambda: not any(r["in_flight"] or r["settling"] for r in _api(pigeon, "GET", "/api/v1/queues")["scheduled"])
    )


def test_mail_moved_to_campaign_cb_is_held_by_a_suspension_of_cb_and_not_bounced_with_campaign_ca(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        vip = _send(pigeon, "flaky@d06.test", "X-Tenant: tv1\r\nX-Campaign: ca\r\n")
        rest = _send(pigeon, "flaky@d07.test", "X-Tenant: tv1\r\nX-Campaign: ca\r\n")
        _settled(pigeon, 2)
        body = {"campaign": "ca", "domain": "d06.test", "to_queue": "cb:tv1@d06.test"}
        assert _api(pigeon, "POST", "/api/v1/admin/rebind", body)["rebound"] == 1
        _settled(pigeon, 3)  # tried at once from its new queue, refused again: deferred for an hour
        suspended = _api(pigeon, "POST", "/api/v1/admin/suspend", {"tenant": "tv1", "campaign": "cb"})
        assert suspended["held"] == 1, suspended  # before: 0
        rule = suspended["rule"]["id"]
        seen = _api(pigeon, "GET", f"/api/v1/messages/{vip}")
        assert (seen["queue"], seen["suspended_by"]) == ("cb:tv1@d06.test", rule), seen
        # What inspect says of it agrees with its queue.
        assert (seen["tenant"], seen["campaign"]) == ("tv1", "cb"), seen
        # Made due while the suspension stands, it stays held: before, it was delivered.
        retried = _api(pigeon, "POST", "/api/v1/admin/retry", {"domain": "d06.test"})
        assert (retried["made_due"], retried["suspended"]) == (0, 1), retried
        assert sink.after(2.0) == []
        # Campaign ca is what is left of it: the moved mail is not bounced with it.
        assert _api(pigeon, "POST", "/api/v1/admin/bounce", {"campaign": "ca"})["bounced"] == 1
        bounced = wait_until(lambda: pigeon.records("AdminBounce"))
        assert [r["id"] for r in bounced] == [rest]
        assert _api(pigeon, "GET", f"/api/v1/messages/{vip}")["queue"] == "cb:tv1@d06.test"
        # Resumed, it goes, from its new queue.
        assert _api(pigeon, "DELETE", f"/api/v1/admin/suspend/{rule}")["made_due"] == 1
        (received,) = sink.wait_for(1)
        assert received.recipients == ["flaky@d06.test"]
        (delivery,) = wait_until(lambda: pigeon.records("Delivery"))
        assert (delivery["id"], delivery["queue"]) == (vip, "cb:tv1@d06.test")
        assert len(pigeon.records("AdminBounce")) == 1


def test_mail_moved_to_another_domains_queue_is_held_by_a_suspension_of_that_domain(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        moved = _send(pigeon, "flaky@d06.test", "X-Tenant: ta\r\n")
        parked = _send(pigeon, "tempfail@d06.test", "X-Tenant: tb\r\n")
        _settled(pigeon, 2)
        rebind = "/api/v1/admin/rebind"
        assert _api(pigeon, "POST", rebind, {"tenant": "ta", "to_queue": "tu1@parked1.test"})["rebound"] == 1
        # A queue named without a domain part keeps its mail matched by its recipients' domain.
        assert _api(pigeon, "POST", rebind, {"tenant": "tb", "to_queue": "parking"})["rebound"] == 1
        _settled(pigeon, 4)
        by_new_domain = _api(pigeon, "POST", "/api/v1/admin/suspend", {"domain": "parked1.test"})
        assert by_new_domain["held"] == 1, by_new_domain  # before: 0
        assert _api(pigeon, "GET", f"/api/v1/messages/{moved}")["suspended_by"] == by_new_domain["rule"]["id"]
        by_old_domain = _api(pigeon, "POST", "/api/v1/admin/suspend", {"domain": "d06.test"})
        assert by_old_domain["held"] == 1, by_old_domain  # the mail in `parking` alone
        assert _api(pigeon, "GET", f"/api/v1/messages/{parked}")["suspended_by"] == by_old_domain["rule"]["id"]
        retried = _api(pigeon, "POST", "/api/v1/admin/retry", {"domain": "*"})
        assert (retried["made_due"], retried["suspended"]) == (0, 2), retried
        assert sink.after(2.0) == []
        assert _api(pigeon, "POST", "/api/v1/admin/bounce", {"tenant": "ta"})["bounced"] == 0
        assert _api(pigeon, "DELETE", f"/api/v1/admin/suspend/{by_new_domain['rule']['id']}")["made_due"] == 1
        (received,) = sink.wait_for(1)
        assert received.recipients == ["flaky@d06.test"]  # moved, not rerouted: its recipient is the same
        (delivery,) = wait_until(lambda: pigeon.records("Delivery"))
        assert (delivery["id"], delivery["queue"]) == (moved, "tu1@parked1.test")
        assert len(sink.after(1.0)) == 1  # the `parking` mail is still held
        assert not pigeon.records("AdminBounce")


POLICY = """
    from pigeon.policy import Changes

    def on_message(message):
        if message.headers["Subject"] == "vip":
            return Changes(queue="cb:tv1@d06.test")
        return None
"""


def test_mail_a_policy_put_in_campaign_cbs_queue_is_held_by_a_suspension_of_cb(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(POLICY))
    with _node(tmp_path / "node", sink, policy={"module": str(module)}) as pigeon:
        rule = _api(pigeon, "POST", "/api/v1/admin/suspend", {"campaign": "cb"})["rule"]["id"]
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            for subject in ("vip", "other"):
                headers = f"X-Tenant: tv1\r\nX-Campaign: ca\r\nSubject: {subject}\r\n\r\nhi\r\n"
                client.sendmail("a@example.org", ["ok@d06.test"], headers.encode())
        (other,) = sink.wait_for(1)
        assert other.email["Subject"] == "other"  # campaign ca's queue: not suspended
        # (The sink has it a moment before the node has taken it out of its spool.)
        wait_until(lambda: len(pigeon.spool_messages()) == 1)
        (held,) = pigeon.spool_messages()
        seen = _api(pigeon, "GET", f"/api/v1/messages/{held['id']}")
        assert (seen["queue"], seen["suspended_by"]) == ("cb:tv1@d06.test", rule), seen
        assert _api(pigeon, "POST", "/api/v1/admin/bounce", {"campaign": "ca"})["bounced"] == 0
        assert sink.after(1.5) == [other]
        assert _api(pigeon, "DELETE", f"/api/v1/admin/suspend/{rule}")["made_due"] == 1
        assert [m.email["Subject"] for m in sink.wait_for(2)] == ["other", "vip"]
