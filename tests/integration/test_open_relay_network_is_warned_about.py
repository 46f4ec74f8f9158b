"""A `relay_networks` entry that covers much of the Internet makes Pigeon an open relay: the
node still starts (a firewall may stand in front), but says so at start and at each reload."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.support.process import PigeonProcess


def test_an_internet_wide_relay_network_is_warned_about_at_start_and_at_each_reload(tmp_path: Path) -> None:
    networks = ["127.0.0.0/8", "10.0.0.0/8", "fc00::/7", "0.0.0.0/0", "::/0", "64.0.0.0/3"]
    whole = (
        "WARNING pigeon.node.node: [smtp] relay_networks entry '{}' covers {}: any client there may relay "
        "mail through Pigeon to any domain without AUTH (an open relay); keep it only if a firewall lets "
        "none but your own clients reach the SMTP port"
    )
    warnings = [
        whole.format("0.0.0.0/0", "the whole Internet"),
        whole.format("::/0", "the whole Internet"),
        whole.format("64.0.0.0/3", "536,870,912 addresses"),
    ]
    with PigeonProcess(tmp_path / "node", smtp={"relay_networks": networks}) as pigeon:
        for warning in warnings:
            pigeon.wait_stderr(warning)
        assert pigeon.process is not None
        pigeon.process.send_signal(signal.SIGHUP)
        pigeon.wait_stderr("reloaded:")
        stderr = pigeon.stderr()
        for warning in warnings:
            assert stderr.count(warning) == 2, stderr
        # A private network, however large, is no open relay.
        assert "'10.0.0.0/8'" not in stderr and "'fc00::/7'" not in stderr and "'127.0.0.0/8'" not in stderr
