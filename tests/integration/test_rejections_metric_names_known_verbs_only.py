"""`pigeon_rejections_total` names a refused command by its verb only when Pigeon knows the verb;
anything else a client sends is counted as `command="other"`. A client sending made-up verbs
must not grow /metrics (and the worker's memory) by one series for each, nor write its own text
into the operator's metrics. The `Rejection` record still names the command as it was sent."""

from __future__ import annotations

import random
import re
import string
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp

KNOWN = {"EHLO", "HELO", "MAIL", "RCPT", "DATA", "BDAT", "RSET", "NOOP", "QUIT", "VRFY", "EXPN", "HELP"}
KNOWN |= {"STARTTLS", "AUTH"}
_SAMPLE = re.compile(r"^pigeon_rejections_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def _rejection_series(body: bytes) -> dict[tuple[str, str], float]:
    """(command, code) -> count, from the text of /metrics."""
    series: dict[tuple[str, str], float] = {}
    for line in body.decode().splitlines():
        match = _SAMPLE.match(line)
        if match is not None:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match["labels"]))
            series[labels["command"], labels["code"]] = float(match["value"])
    return series


def test_made_up_verbs_are_counted_as_other_and_logged_as_sent(tmp_path: Path) -> None:
    rng = random.Random(799)
    verbs: list[str] = []
    while len(verbs) < 50:
        verb = "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(rng.randint(3, 16)))
        if verb not in KNOWN and verb not in verbs:
            verbs.append(verb)
    with PigeonProcess(tmp_path / "node") as pigeon:
        for start in range(0, len(verbs), 10):  # five connections, ten made-up verbs each
            with RawSmtp(pigeon.smtp_port) as client:
                client.expect(220)
                for verb in verbs[start : start + 10]:
                    client.expect(500, f"{verb} some argument")
                client.expect(501, "quit now")  # a known verb refused keeps its name
                # An HTTP proxy probe is no refused greeting (`command="CONNECT"`): "other" too.
                client.expect(500, "CONNECT mx.example.org:443 HTTP/1.1")
                client.expect(221, "QUIT")
        records = pigeon.wait_records("Rejection", len(verbs) + 10)
        status, body = pigeon.http_get("/metrics")

    assert status == 200
    assert _rejection_series(body) == {("other", "500"): 55.0, ("QUIT", "501"): 5.0}
    for verb in verbs:
        assert verb not in body.decode()
    # The log still names each command as the client sent it.
    made_up = [record["command"] for record in records if record["response"]["code"] == 500]
    assert made_up == [name for start in range(0, 50, 10) for name in (*verbs[start : start + 10], "CONNECT")]
