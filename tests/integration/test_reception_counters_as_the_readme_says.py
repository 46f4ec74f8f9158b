"""The reception counters count what the README says, so an operator can square them with the
event log: `pigeon_receptions_total` one per store answered (an SMTP transaction), however many
spool messages it makes; `pigeon_messages_received_total` one per spool message (one per
recipient domain, each with its `Reception`); `pigeon_bytes_received_total` each body once,
where the `Reception` records give its size once per message; and
`pigeon_rejections_total{command="inject"}` an injection refused whole once, a recipient refused
on its own once each. An outside tester found the sums disagreeing and no word on why."""

from __future__ import annotations

import re
import smtplib
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import wait_until

README = Path(__file__).resolve().parents[2] / "README.md"
TOKEN = "counters-token-0123456789"
_SAMPLE = re.compile(r"^(\w+)(?:\{([^}]*)\})? (\S+)$")


def _counters(node: PigeonProcess) -> dict[str, float]:
    """Every sample of /metrics by its name and labels, as Prometheus prints them."""
    status, body = node.http_get("/metrics")
    assert status == 200
    found = {}
    for line in body.decode().splitlines():
        if (sample := _SAMPLE.match(line)) is not None:
            name, labels, value = sample.groups()
            found[f"{name}{{{labels}}}" if labels else name] = float(value)
    return found


def _grew(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def test_the_reception_counters_count_what_the_readme_says(tmp_path: Path) -> None:
    tokens = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]
    with PigeonProcess(tmp_path / "node", http={"token": tokens}) as node:
        before = _counters(node)
        with smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
            client.ehlo("client.test")
            recipients = ["a@one.test", "b@two.test", "c@three.test"]
            client.sendmail("sender@example.org", recipients, b"Subject: three\r\n\r\n" + (b"x" * 78 + b"\r\n") * 50)
        records = wait_until(lambda: len(node.records("Reception")) == 3 and node.records("Reception"))
        after = _counters(node)
        assert _grew(before, after, 'pigeon_receptions_total{listener="smtp"}') == 1
        assert _grew(before, after, "pigeon_messages_received_total") == 3
        body = _grew(before, after, "pigeon_bytes_received_total")
        assert {record["size"] for record in records} == {body}
        assert sum(record["size"] for record in records) == 3 * body

        # Refused whole (a recipient's address): once, for three recipients.
        request = {
            "envelope_sender": "app@example.org",
            "recipients": [{"email": "x@one.test"}, {"email": "not an address"}, {"email": "y@two.test"}],
            "content": {"from": {"email": "app@example.org"}, "subject": "hi {{ who }}", "text": "x"},
        }
        assert node.http_post("/api/v1/inject", request, TOKEN)[0] == 400
        # Each recipient refused on its own (`who` is given to none): once each.
        request["recipients"][1] = {"email": "z@three.test"}
        assert node.http_post("/api/v1/inject", request, TOKEN)[0] == 422
        wait_until(lambda: len(node.records("Rejection")) == 4)
        counted = _counters(node)
        assert _grew(after, counted, 'pigeon_rejections_total{code="400",command="inject"}') == 1
        assert _grew(after, counted, 'pigeon_rejections_total{code="554",command="inject"}') == 3

    said = README.read_text()
    assert "What the reception counters count, to square them with the event log:" in said
    for words in (
        "- `pigeon_receptions_total{listener}` counts receptions",
        "- `pigeon_messages_received_total` counts spool messages",
        "- `pigeon_bytes_received_total` counts each reception's body once",
        "the sum of `Reception.size` is larger",
        "an injection refused whole (400,",
        "once, however many\n  recipients it names, and each recipient refused on its own",
    ):
        assert words in said, words
