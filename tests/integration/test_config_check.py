"""`pigeon serve --check`: the configuration checked as `pigeon serve` would check it, nothing
started; and `pigeon shaping check` on a file it cannot read exits as other commands do."""

from __future__ import annotations

import socket
from pathlib import Path

import dns
import pytest

from tests.integration.test_cli import pigeon_cli
from tests.support.ports import free_port
from tests.support.process import PigeonProcess


def test_serve_check_says_ok_for_a_config_that_loads_and_starts_nothing(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "pigeon.toml"
    config.write_text(f'[smtp]\nlisten = "127.0.0.1:{port}"\n[spool]\npath = "spool"\n[log]\npath = "log"\n')
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{config}: ok\n", "")
    assert not (tmp_path / "spool").exists() and not (tmp_path / "log").exists()
    with socket.create_server(("127.0.0.1", port)):  # nothing listens there: it is free
        pass


def test_serve_check_prints_the_error_with_its_file_and_line_and_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "pigeon.toml"
    config.write_text('[spool]\npath = "spool"\n[node]\nuser = "no-such-pigeon-user"\n')
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"pigeon: configuration error: {config}, line 4: [node] user: no user called 'no-such-pigeon-user'"
    )
    assert result.stdout == "" and not (tmp_path / "spool").exists()


def test_serve_check_loads_the_policy_module_as_serve_does(tmp_path: Path) -> None:
    (tmp_path / "mypolicy.py").write_text("raise RuntimeError('broken on purpose')\n")
    config = tmp_path / "pigeon.toml"
    config.write_text('[spool]\npath = "spool"\n[policy]\nmodule = "mypolicy"\n')
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert result.returncode == 2, result.stderr
    assert "broken on purpose" in result.stderr and result.stdout == ""


def test_shaping_check_of_a_missing_file_exits_2_as_other_commands_do(tmp_path: Path) -> None:
    result = pigeon_cli("shaping", "check", str(tmp_path / "nope.toml"))
    assert result.returncode == 2
    assert result.stderr.startswith(f"pigeon: configuration error: {tmp_path / 'nope.toml'}: cannot read")


def test_serve_check_refuses_a_next_hop_of_numbers_that_is_no_ipv4_address(tmp_path: Path) -> None:
    # Found from outside: next_hop = "1.2.3:25" passed --check (inet_aton reads it as 1.2.0.3).
    config = tmp_path / "pigeon.toml"
    config.write_text('[spool]\npath = "spool"\n[[route]]\ndomain = "a.example"\nnext_hop = "1.2.3:25"\n')
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(
        f"pigeon: configuration error: {config}, line 5: [[route]] #1 next_hop: '1.2.3:25': '1.2.3' is not a host"
        ' name: its last label, "3", is all digits'
    ), result.stderr


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (
            "[smtp]\nrelay_networks = [[true]]",
            'line 2: [smtp] relay_networks: [true] is not an IP network like "127.0.0.0/8"',
        ),
        ("[spool]\nmax_size = [true, 1]", "line 2: [spool] max_size: [true, 1] is not a size"),
        ("[delivery]\nconnect_timeout = -inf", "line 2: [delivery] connect_timeout: -inf is not a duration"),
        ("[delivery]\nconnect_timeout = nan", "line 2: [delivery] connect_timeout: nan is not a duration"),
        (
            "[delivery]\nconnect_timeout = 2024-01-01T00:00:00",
            "line 2: [delivery] connect_timeout: 2024-01-01T00:00:00 is not a duration",
        ),
        ("[dns]\nnameservers = [2024-01-01]", "line 2: [dns] nameservers: 2024-01-01 is not an address like"),
        ('[[route]]\ndomain = "a"\nnext_hop = 07:32:00', "line 3: [[route]] #1 next_hop: 07:32:00 is not an address"),
        ("[spool]\nmax_size = { a = true }", "line 2: [spool] max_size: { a = true } is not a size"),
        ("[smtp]\nmax_recipients = -inf", "line 2: [smtp] max_recipients: expected a whole number, got a number -inf"),
        (
            "[smtp]\nmax_recipients = 2024-01-01",
            "line 2: [smtp] max_recipients: expected a whole number, got a date 2024-01-01",
        ),
        (
            "[smtp]\nstarttls = 1979-05-27T07:32:00Z",
            "line 2: [smtp] starttls: expected true or false, got a date and time 1979-05-27T07:32:00Z",
        ),
    ],
    ids=[
        "list-of-bools",
        "list",
        "minus-inf",
        "nan",
        "datetime",
        "date-in-list",
        "time",
        "inline-table",
        "minus-inf-int",
        "date-int",
        "datetime-bool",
    ],
)
def test_serve_check_names_a_refused_value_as_the_file_writes_it(tmp_path: Path, line: str, said: str) -> None:
    # Found from outside: `[True]`, `datetime.date(2024, 1, 1)` in messages about a TOML file.
    config = tmp_path / "pigeon.toml"
    config.write_text(f"{line}\n")
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert (result.returncode, result.stdout) == (2, ""), result
    assert result.stderr.startswith(f"pigeon: configuration error: {config}, {said}"), result.stderr


def test_serve_check_warns_of_dane_trusting_a_nameserver_beyond_loopback_and_not_of_localhost(tmp_path: Path) -> None:
    config = tmp_path / "pigeon.toml"
    base = '[spool]\npath = "spool"\n[dane]\nenabled = true\n[dns]\n'
    config.write_text(base + 'nameservers = ["192.0.2.53:53"]\n')
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(
        "pigeon: warning: [dane] enabled trusts the AD bit of its nameservers' answers, and [dns] nameservers names "
        "192.0.2.53, not on this host's loopback"
    )
    config.write_text(base + 'nameservers = ["localhost:5389"]\n')
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert (result.returncode, result.stderr) == (0, "")


def test_serve_check_warns_of_a_delay_warning_that_max_age_never_lets_fire(tmp_path: Path) -> None:
    # Found from outside: delay_warning = "10d" with max_age = "2m" was taken silently.
    config = tmp_path / "pigeon.toml"
    config.write_text(
        '[spool]\npath = "spool"\n[delivery]\nmax_age = "2m"\ndelay_warning = "10d"\n'
        '[[queue]]\nname = "bulk:*"\nmax_age = "1h"\ndelay_warning = "4h"\n'
        '[[queue]]\nname = "fine:*"\nmax_age = "1d"\ndelay_warning = "4h"\n'
    )
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert (result.returncode, result.stdout) == (0, f"{config}: ok\n"), result.stderr  # a warning, not an error
    assert result.stderr.splitlines() == [
        'pigeon: warning: [delivery] delay_warning "10d" is not shorter than [delivery] max_age "2m": mail expires '
        "before it has waited that long, so no delayed DSN is ever sent; make it shorter than max_age (or 0: none)",
        'pigeon: warning: [[queue]] #1 (name \'bulk:*\'): delay_warning "4h" is not shorter than its max_age "1h": '
        "its mail expires before it has waited that long, so no delayed DSN is ever sent; make it shorter than "
        "max_age (or 0: none)",
    ]


def _check_warnings(config: Path) -> list[str]:
    """The warnings `serve --check` says of `config`, which it must still pass (exit 0, ok)."""
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert (result.returncode, result.stdout) == (0, f"{config}: ok\n"), result.stderr  # warnings, not errors
    said = result.stderr.splitlines()
    assert all(line.startswith("pigeon: warning: ") for line in said), said
    return [line.removeprefix("pigeon: warning: ") for line in said]


def test_serve_check_warns_of_an_open_relay_and_of_routes_never_used(tmp_path: Path) -> None:
    # Found from outside: --check said "ok" and nothing else of what `pigeon serve` warns at start.
    config = tmp_path / "pigeon.toml"
    config.write_text(
        '[spool]\npath = "spool"\n[smtp]\nrelay_networks = "0.0.0.0/0"\n'
        '[[route]]\ndomain = "*.test"\nnext_hop = "127.0.0.1:9"\n'
        '[[route]]\ndomain = "defer.test"\nnext_hop = "127.0.0.1:9"\n'
        '[[target]]\nname = "app"\nkind = "log"\npath = "handed.log"\n'
        '[[inbound]]\ndomain = "app.test"\ntarget = "app"\n'
        '[[inbound]]\nrecipient = "reply+*@app.test"\ntarget = "app"\n'
    )
    assert _check_warnings(config) == [
        "[smtp] relay_networks entry '0.0.0.0/0' covers the whole Internet: any client there may relay mail "
        "through Pigeon to any domain without AUTH (an open relay); keep it only if a firewall lets none but your "
        "own clients reach the SMTP port",
        "[[route]] #2 (domain 'defer.test') is never used: #1 (domain '*.test') comes first and matches every "
        "domain it does (the first route that matches wins): move it up, or remove it",
        "[[inbound]] #2 (recipient 'reply+*@app.test') is never used: #1 (domain 'app.test') comes first and takes "
        "every address it does (the first route that matches wins): move it up, or remove it",
    ]
    assert not (tmp_path / "spool").exists()


def test_serve_check_warns_of_a_config_holding_secrets_that_others_may_read(tmp_path: Path) -> None:
    config = tmp_path / "pigeon.toml"
    config.write_text(
        '[spool]\npath = "spool"\n[http]\nlocal_token = false\n'
        '[[http.token]]\nname = "app"\ntoken = "0123456789abcdef0123456789abcdef"\nscopes = ["inject"]\n'
    )
    config.chmod(0o644)
    assert _check_warnings(config) == [
        f"{config} is readable by other users (mode 0644), and it holds [[http.token]] secrets: chmod 600 {config} "
        "(or 640 with a group that only the user Pigeon runs as is in)"
    ]
    config.chmod(0o600)
    assert _check_warnings(config) == []


def test_serve_check_says_every_warning_the_start_of_the_same_config_says(tmp_path: Path) -> None:
    """One list of the configuration's warnings, said by both: a warning added to the start
    and not to --check (or the other way) fails here."""
    target = {"name": "app", "kind": "log", "path": "handed.log"}
    token = {"name": "app", "token": "0123456789abcdef0123456789abcdef", "scopes": ["inject"]}
    routes = [{"domain": domain, "next_hop": "127.0.0.1:9", "tls": "disabled"} for domain in ("*.test", "a.test")]
    pigeon = PigeonProcess(
        tmp_path / "node",
        smtp={"relay_networks": ["127.0.0.0/8", "0.0.0.0/0", "64.0.0.0/3"]},
        delivery={"max_age": "2m", "delay_warning": "10d"},  # (and off: said too)
        tables={
            "route": routes,
            "target": [target],
            "inbound": [{"recipient": "*", "target": "app"}, {"domain": "app.test", "target": "app"}],
            "http.token": [token],
        },
    )
    pigeon.config_path.chmod(0o644)
    checked = _check_warnings(pigeon.config_path)
    assert len(checked) >= 7, checked
    with pigeon:
        said = pigeon.stderr()
    # What the environment of the start alone decides (who starts it, its limits) is no
    # warning about the configuration: --check cannot know it.
    environment = ("running as root", "open files")
    started = [
        line.partition(" WARNING ")[2].partition(": ")[2]
        for line in said.splitlines()
        if " main WARNING " in line and not any(word in line for word in environment)
    ]
    assert started == checked, said


def test_serve_check_says_the_policy_modules_warnings_as_warnings_and_the_start_says_the_same(
    tmp_path: Path,
) -> None:
    """Found from outside: a misspelt hook (`on_mesage`) and a module beside the policy that
    `import` cannot reach (a dns.py) were printed by --check bare, without the `pigeon: warning:`
    every other warning has; and `On_Connect`, in the wrong case, was said nothing of."""
    root = tmp_path / "node"
    root.mkdir()
    (root / "mypolicy.py").write_text(
        "def on_mesage(message):\n    pass\ndef On_Connect(connection):\n    pass\n"
        "def on_connect(connection):\n    pass\n"
    )
    (root / "dns.py").write_text("raise SystemExit('not imported')\n")
    pigeon = PigeonProcess(root, policy={"module": "mypolicy"})
    checked = _check_warnings(pigeon.config_path)
    hooks = "the hooks are on_connect, on_mail_from, on_rcpt_to, on_message, before_delivery, on_delivery_outcome"
    module = root / "mypolicy.py"
    policy = [warning for warning in checked if warning.startswith("policy ")]
    assert policy == [
        f"policy {module}: {root / 'dns.py'} is not what `import dns` imports: {dns.__file__} is (Python's modules "
        "and those installed come first); a module of the policy's own needs a name of its own",
        f"policy {module}: On_Connect is not a hook name and is never called (did you mean on_connect?); {hooks}",
        f"policy {module}: on_mesage is not a hook name and is never called (did you mean on_message?); {hooks}",
    ]
    assert checked[-3:] == policy  # after the configuration's, as a start says them
    with pigeon:
        said = pigeon.stderr()
    started = [
        line.partition(" WARNING ")[2].partition(": ")[2]
        for line in said.splitlines()
        if " main WARNING " in line and "running as root" not in line and "open files" not in line
    ]
    assert started == checked, said
