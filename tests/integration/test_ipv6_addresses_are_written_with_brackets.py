"""An IPv6 address with a port is written "[::1]:2525" wherever Pigeon shows one, as the
configuration writes it: "::1:2525" could be the address ::1:2525 on no port at all."""

from __future__ import annotations

from pathlib import Path

from tests.support.ports import free_port
from tests.support.process import PigeonProcess, to_toml


def test_the_listening_lines_write_an_ipv6_address_in_brackets(tmp_path: Path) -> None:
    # Found from outside: "smtp listening on ::1:44125", while errors of the same run wrote
    # "[::1]:44127".
    v6 = free_port()
    pigeon = PigeonProcess(tmp_path / "node")
    pigeon.config["smtp"]["listen"].append(f"[::1]:{v6}")
    pigeon.config_path.write_text(to_toml(pigeon.config))
    with pigeon:
        said = pigeon.stderr()
    assert f"smtp listening on [::1]:{v6}" in said, said
    assert f"smtp listening on 127.0.0.1:{pigeon.smtp_port}" in said, said
