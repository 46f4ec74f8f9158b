"""A route a policy gives (`Changes(route=...)` at on_message, `Reroute(...)` before delivery) is a
domain name, checked as a `[[route]] domain` is: one that is none fails the hook (451 4.3.0 to the
client at on_message; before delivery, the attempt deferred with 451 4.3.0), as other answers that
cannot be carried out do. Found from outside: `route="a..b"`, a label of 64 characters or a name of
300 were taken with 250, then retried for max_age (5 days) with `451 4.4.3 DNS lookup of MX a..b
failed: A DNS label is empty.`"""

from __future__ import annotations

import smtplib
import textwrap
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

MESSAGE = b"From: <sender@example.org>\r\nSubject: hello\r\n\r\nHello.\r\n"
# Each recipient's local part names the route its hook gives.
ROUTES = {
    "empty-label": ("a..b", "has an empty label (a dot at the start, or two in a row, as in 'a..b')"),
    "long-label": ("x" * 64 + ".test", "has a label of 64 characters; a host name's are at most 63"),
    "long-name": ("a." * 150 + "test", "is 304 characters long; a host name is at most 253"),
    "glob": ("*.test", "holds '*', '?' or '[': a route is one domain name, not a glob"),
    "at": ("relay@test", "holds '@', which no host name holds"),
}
SOURCE = """
    from pigeon.policy import Changes, Reroute
    ROUTES = {routes!r}
    def on_message(message):
        local = message.recipients[0].partition("@")[0]
        if message.recipients[0].endswith("@routed.test"):
            return Changes(route=ROUTES[local])
    def before_delivery(delivery):
        local = delivery.recipients[0].partition("@")[0]
        if delivery.attempt == 1 and delivery.recipients[0].endswith("@rerouted.test"):
            return Reroute(ROUTES[local])
"""


def test_a_route_that_is_no_domain_name_fails_the_hook_at_on_message_and_before_delivery(tmp_path: Path) -> None:
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(SOURCE).format(routes={k: route for k, (route, _) in ROUTES.items()}))
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint, retry_interval="0.5s", dsn=False)
        with PigeonProcess(tmp_path / "node", policy={"module": str(module)}, **config) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                client.ehlo("client.test")
                for local in ROUTES:
                    client.mail("a@example.org")
                    client.rcpt(f"{local}@routed.test")
                    assert client.data(MESSAGE) == (451, b"4.3.0 policy error; try again later"), local
                    client.sendmail("a@example.org", [f"{local}@rerouted.test"], MESSAGE)
            failures = pigeon.wait_records("PolicyFailure", 2 * len(ROUTES))
            for hook, action, what in (
                ("on_message", "451 4.3.0", "route"),
                ("before_delivery", "deferred", "Reroute domain"),
            ):
                said = [f["error"] for f in failures if f["hook"] == hook]
                assert all(f["action"] == action for f in failures if f["hook"] == hook), failures
                for route, problem in ROUTES.values():
                    assert f"ValueError: {what} {route!r:.40}" in "\n".join(said), said
                    assert sum(problem in error for error in said) == 1, (problem, said)
            # Before delivery: deferred (451 4.3.0, counted as an attempt), then sent as routed.
            transients = pigeon.wait_records("TransientFailure", len(ROUTES))
            assert {(t["response"]["code"], t["response"]["enhanced"]) for t in transients} == {(451, "4.3.0")}
            deliveries = pigeon.wait_records("Delivery", len(ROUTES))
            assert sorted(d["recipient"] for d in deliveries) == sorted(f"{local}@rerouted.test" for local in ROUTES)
            assert {d["attempt"] for d in deliveries} == {2}
            assert "DNS lookup" not in pigeon.stderr()
