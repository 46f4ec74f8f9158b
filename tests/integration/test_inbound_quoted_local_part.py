"""An `[[inbound]] recipient` glob matches the value of a quoted local part (its content, quoted
pairs resolved), as it matches a dot-string: `"reply+q z"@app.example` is `reply+q z`, which
`reply+*@app.example` takes. Matched as written, quotes and all, it was unknown to a client
outside relay_networks (550 5.1.1) and relayed to the domain's MX for a relay client (in a real
setup this node: a loop). The application still gets the address as it was written."""

from __future__ import annotations

import smtplib
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

MESSAGE = b"From: <customer@example.com>\r\nSubject: a reply\r\n\r\nHello.\r\n"
RECIPIENTS = ['"reply+q z"@app.example', '"Reply+a\\"b"@app.example', "reply+a@app.example"]


def test_a_quoted_local_part_that_is_no_dot_string_is_routed_by_its_value_and_handed_over_as_written(
    tmp_path: Path,
) -> None:
    with ScriptedSink() as mx:  # where mail no route takes goes out
        node = PigeonProcess(
            tmp_path / "p",
            smtp={"relay_networks": ["127.0.0.2/32"]},  # 127.0.0.1 is outside, 127.0.0.2 a relay client
            target=[{"name": "app", "kind": "maildir", "path": str(tmp_path / "Maildir")}],
            inbound=[{"recipient": "reply+*@app.example", "target": "app"}],
            **delivery_config(mx.endpoint),
        )
        with node:
            replies = {}
            for source in ("127.0.0.1", "127.0.0.2"):
                with smtplib.SMTP("127.0.0.1", node.smtp_port, source_address=(source, 0)) as client:
                    client.ehlo("client.test")
                    assert client.mail("customer@example.com")[0] == 250
                    for recipient in RECIPIENTS:
                        replies[source, recipient] = client.rcpt(f"<{recipient}>")[0]
                    assert client.data(MESSAGE)[0] == 250
            assert set(replies.values()) == {250}, replies
            deliveries = node.wait_records("Delivery", 6, timeout=20)
            assert mx.after(0.5) == [], "nothing goes out to an MX"
    assert {r["queue"] for r in deliveries} == {"inbound:app"}
    assert sorted(r["recipient"] for r in deliveries) == sorted(RECIPIENTS * 2)
    files = sorted((tmp_path / "Maildir" / "new").iterdir())
    assert len(files) == 2
    for file in files:
        text = file.read_bytes()
        assert b"".join(b"X-Original-To: %s\r\n" % r.encode() for r in RECIPIENTS) in text, text[:300]
