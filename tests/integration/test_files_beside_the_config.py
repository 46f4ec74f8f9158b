"""Files beside the config file (and the directory `pigeon serve` runs in) are the operator's:
a script there named like a module Pigeon or a library of its uses (`dns.py` beside a DNS
server of one's own) must not stand in for that module, while the policy module still imports
its own modules from there (`import helpers`). A node's start that imported such a file hung
for good, before it served, and said nothing of why."""

from __future__ import annotations

import smtplib
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

# A DNS server of one's own: it never returns from its import.
_DNS_SERVER = """
import time
from pathlib import Path

(Path(__file__).parent / "dns-server-ran").touch()
while True:
    time.sleep(1)
"""
_POLICY = """
import helpers

def on_rcpt_to(rcpt):
    return helpers.refusal(rcpt.recipient)
"""
_HELPERS = """
from pigeon.policy import Refuse

def refusal(recipient):
    return Refuse(550, "helpers said no") if recipient.startswith("no@") else None
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_a_dns_py_beside_the_config_is_not_dnspython_and_the_policy_still_imports_its_own_modules(
    tmp_path: Path, workers: int
) -> None:
    root = tmp_path / "node"
    root.mkdir()
    (root / "dns.py").write_text(_DNS_SERVER)
    (root / "mypolicy.py").write_text(_POLICY)
    (root / "helpers.py").write_text(_HELPERS)
    with (
        ScriptedSink() as sink,
        # (PigeonProcess runs `python -m pigeon` in `root`: the directory it runs in, too.)
        PigeonProcess(
            root, node={"workers": workers}, policy={"module": "mypolicy"}, **delivery_config(sink.endpoint)
        ) as pigeon,
    ):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
            client.ehlo()
            client.mail("a@example.org")
            assert client.rcpt("no@example.net") == (550, b"5.7.1 helpers said no")
            assert client.rcpt("yes@example.net")[0] == 250
            assert client.data(b"Subject: hi\r\n\r\nhello\r\n")[0] == 250
        sink.wait_for(1)  # delivered: the MX side (dnspython) was imported, not the script
        assert not (root / "dns-server-ran").exists()
        said = pigeon.stderr()
        assert f"{root / 'dns.py'} is not what `import dns` imports" in said, said
