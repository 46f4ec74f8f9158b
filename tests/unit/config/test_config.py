"""Loading the configuration: defaults that run a node with no file at all, units an operator
can read, paths relative to the file, and errors that point at the file, line and key."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pigeon.config.load import ConfigError, load, load_text
from pigeon.config.schema import Config, WebhookTarget
from pigeon.listener.tls import ensure_self_signed
from pigeon.policy.hooks import Policy

FULL = """\
# A complete configuration, every section present.
[node]
name = "mx1.example.org"
workers = 4
shutdown_timeout = "5m"

[smtp]
listen = ["0.0.0.0:25", "[::1]:2525"]
hostname = "mx1.example.org"
relay_networks = ["10.0.0.0/8", "192.0.2.7", "2001:db8::/32"]
max_message_size = "25MiB"
max_recipients = 50
idle_timeout = "250ms"
command_timeout = 90
bare_linefeeds = "normalise"
pipelining = false
tls_certificate = "tls/cert.pem"
tls_private_key = "tls/key.pem"
auth_users = "users"

[http]
listen = "127.0.0.1:9000"

[spool]
path = "data/spool"
inline_limit = "64KiB"
commit_window = "2ms"
max_batch = 256
max_size = "10MB"

[log]
path = "/var/log/pigeon"
max_segment_size = 1048576
max_segment_age = "2h"
compress = false
level = "debug"
"""


def files_named_by_full(directory: Path) -> None:
    """The users file and TLS pair FULL names: files the config names must exist (and the
    TLS pair be a certificate and its key)."""
    (directory / "tls").mkdir(parents=True, exist_ok=True)
    (directory / "users").touch()
    write_pair(directory / "tls/cert.pem", directory / "tls/key.pem")


def write_pair(certificate: Path, key: Path, *, hostname: str = "mx1.example.org") -> None:
    """A real self-signed certificate in `certificate` and its key in `key`, both PEM."""
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(private, hashes.SHA256())
    )
    certificate.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pkcs8, clear = serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, pkcs8, clear))


def write(tmp_path: Path, text: str, name: str = "pigeon.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


WORKERS = 'must be "auto" or a number of worker processes from 1 to 64'


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load(path)
    return str(caught.value)


# --- defaults ------------------------------------------------------------------------------
def test_no_file_gives_a_working_local_node() -> None:
    config = load(None)

    assert config.smtp.listen == ["127.0.0.1:2525"]
    assert (config.smtp.listen[0].host, config.smtp.listen[0].port) == ("127.0.0.1", 2525)
    assert config.http.listen == "127.0.0.1:8025"
    assert (config.http.listen.host, config.http.listen.port) == ("127.0.0.1", 8025)
    assert config.spool.path == Path("var/spool")
    assert config.log.path == Path("var/log")
    assert config.smtp.max_message_size == 25 * 1024 * 1024
    assert config.spool.inline_limit == 256 * 1024
    assert config.smtp.idle_timeout == 300.0
    assert [n.network for n in config.smtp.relay_networks] == [
        ipaddress.ip_network("127.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
    ]
    assert config.node.workers == "auto"
    assert config.node.worker_count == max(1, len(os.sched_getaffinity(0)) - 1)  # one CPU left to the rest
    assert config.smtp.tls_certificate is None
    assert config.smtp.auth_users is None


def test_empty_file_gives_the_defaults_with_paths_beside_the_file(tmp_path: Path) -> None:
    config = load(write(tmp_path, ""))
    defaults = load(None)

    assert config.smtp.listen == defaults.smtp.listen
    assert config.http.listen == defaults.http.listen
    assert config.spool.path == tmp_path / "var/spool"
    assert config.log.path == tmp_path / "var/log"


# --- a full file ---------------------------------------------------------------------------
def test_full_file_parses_units_networks_and_addresses(tmp_path: Path) -> None:
    files_named_by_full(tmp_path)
    config = load(write(tmp_path, FULL))

    assert isinstance(config, Config)
    assert config.node.name == "mx1.example.org"
    assert config.node.workers == 4
    assert config.node.worker_count == 4
    assert config.node.shutdown_timeout == 300.0
    assert [(e.host, e.port) for e in config.smtp.listen] == [("0.0.0.0", 25), ("::1", 2525)]
    assert [n.network for n in config.smtp.relay_networks] == [
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("192.0.2.7/32"),
        ipaddress.ip_network("2001:db8::/32"),
    ]
    assert config.smtp.max_message_size == 25 * 1024 * 1024
    assert config.smtp.max_recipients == 50
    assert config.smtp.idle_timeout == pytest.approx(0.25)
    assert config.smtp.command_timeout == 90.0
    assert config.smtp.bare_linefeeds == "normalise"
    assert config.smtp.pipelining is False
    assert config.http.listen.port == 9000
    assert config.spool.inline_limit == 64 * 1024
    assert config.spool.commit_window == pytest.approx(0.002)
    assert config.spool.max_batch == 256
    assert config.spool.max_size == 10_000_000
    assert config.log.max_segment_size == 1_048_576
    assert config.log.max_segment_age == 7200.0
    assert config.log.compress is False
    assert config.log.level == "debug"


@pytest.mark.parametrize(
    ("written", "seconds"),
    [("5m", 300.0), ("250ms", 0.25), ("30s", 30.0), ("2h", 7200.0), ("1d", 86400.0), ("1.5m", 90.0), ("45", 45.0)],
)
def test_durations_accept_units(tmp_path: Path, written: str, seconds: float) -> None:
    config = load(write(tmp_path, f'[smtp]\nidle_timeout = "{written}"\n'))
    assert config.smtp.idle_timeout == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("written", "size"),
    [
        ('"25MiB"', 25 * 1024 * 1024),
        ('"10MB"', 10_000_000),
        ('"64KiB"', 65536),
        ('"1GiB"', 1024**3),
        ('"1.5KiB"', 1536),
        ('"512B"', 512),
        ('"10mb"', 10_000_000),
        ("4096", 4096),
    ],
)
def test_sizes_accept_units_and_plain_bytes(tmp_path: Path, written: str, size: int) -> None:
    config = load(write(tmp_path, f"[smtp]\nmax_message_size = {written}\n"))
    assert config.smtp.max_message_size == size


@pytest.mark.parametrize(
    ("written", "rate"),
    [('"500B/s"', 500), ('"2KB/s"', 2000), ('"1KiB/s"', 1024), ('"1.5 kB/s"', 1500), ('"4KB"', 4000), ("250", 250)],
)
def test_data_rates_accept_units_per_second_and_plain_bytes(tmp_path: Path, written: str, rate: int) -> None:
    config = load(write(tmp_path, f"[smtp]\nmin_data_rate = {written}\n"))
    assert config.smtp.min_data_rate == rate


def test_min_data_rate_and_max_junk_commands_default_to_postfixs(tmp_path: Path) -> None:
    config = load(write(tmp_path, ""))
    assert (config.smtp.min_data_rate, config.smtp.max_junk_commands) == (500, 100)


def test_relative_paths_are_resolved_against_the_config_files_directory(tmp_path: Path) -> None:
    etc = tmp_path / "etc" / "pigeon"
    files_named_by_full(etc)
    config = load(write(etc, FULL))

    assert config.spool.path == etc / "data/spool"
    assert config.smtp.tls_certificate == etc / "tls/cert.pem"
    assert config.smtp.tls_private_key == etc / "tls/key.pem"
    assert config.smtp.auth_users == etc / "users"
    assert config.log.path == Path("/var/log/pigeon")  # absolute paths are kept


def test_relative_paths_do_not_depend_on_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    write(etc, '[spool]\npath = "spool"\n')
    monkeypatch.chdir(tmp_path)

    assert load(Path("etc/pigeon.toml")).spool.path.resolve() == etc / "spool"


def test_workers_accepts_auto(tmp_path: Path) -> None:
    config = load(write(tmp_path, '[node]\nworkers = "auto"\n'))
    assert config.node.workers == "auto"
    assert config.node.worker_count >= 1


# --- errors --------------------------------------------------------------------------------
def test_unknown_key_names_the_file_line_and_key(tmp_path: Path) -> None:
    text = '[node]\nname = "a"\n\n[smtp]\nhostname = "mx"\nlisen = ["127.0.0.1:25"]\n'
    message = error_of(tmp_path, text)

    assert message == f"{tmp_path / 'pigeon.toml'}, line 6: [smtp] lisen: unknown key (did you mean 'listen'?)"


def test_unknown_key_is_found_in_the_right_section(tmp_path: Path) -> None:
    # The same key name elsewhere does not mislead the line number.
    text = '[http]\nlisten = "127.0.0.1:8025"\n\n[spool]\nlisten = "x"\n'
    assert error_of(tmp_path, text).endswith("pigeon.toml, line 5: [spool] listen: unknown key")


def test_unknown_top_level_key_names_its_line(tmp_path: Path) -> None:
    expected = "pigeon.toml, line 3: workers: unknown key: keys go under a [section]"
    assert error_of(tmp_path, "\n\nworkers = 4\n").endswith(expected)


def test_unknown_section_names_its_line(tmp_path: Path) -> None:
    message = error_of(tmp_path, '[node]\nworkers = 2\n\n[smpt]\nlisten = ["127.0.0.1:25"]\n')
    assert message == f"{tmp_path / 'pigeon.toml'}, line 4: smpt: unknown section (did you mean 'smtp'?)"


def test_unknown_key_line_is_found_under_a_commented_section_header(tmp_path: Path) -> None:
    message = error_of(tmp_path, '[smtp]  # the listener\nhostname = "mx"\nlisen = 1\n')
    assert message == f"{tmp_path / 'pigeon.toml'}, line 3: [smtp] lisen: unknown key (did you mean 'listen'?)"


def test_wrong_type_names_the_key_and_the_expected_type(tmp_path: Path) -> None:
    message = error_of(tmp_path, "[smtp]\nhostname = 'mx'\nlisten = 5\n")
    # Found from outside: "Expected `array`", while one address may be given as a string.
    assert message == (
        f'{tmp_path / "pigeon.toml"}, line 3: [smtp] listen: expected a list, e.g. ["127.0.0.1:2525"], '
        "or one string, got a whole number 5"
    )


def test_wrong_type_for_a_single_address(tmp_path: Path) -> None:
    message = error_of(tmp_path, "[http]\nlisten = 5\n")
    assert message.startswith(f"{tmp_path / 'pigeon.toml'}, line 2: [http] listen: ")
    assert "127.0.0.1:2525" in message  # shows what an address looks like


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[smtp]\nidle_timeout = "5 parsecs"\n', "line 2: [smtp] idle_timeout: '5 parsecs' is not a duration"),
        ("[smtp]\nidle_timeout = -5\n", "line 2: [smtp] idle_timeout: -5 is not a duration"),
        # no finite time: named as the key it is, not as another key's comparison with it
        ("[delivery]\nretry_interval = 1e400\n", "line 2: [delivery] retry_interval: inf is not a duration"),
        ("[delivery]\nretry_interval = inf\n", "line 2: [delivery] retry_interval: inf is not a duration"),
        ('[delivery]\nretry_interval = "1e400s"\n', "line 2: [delivery] retry_interval: '1e400s' is not a duration"),
        ('[spool]\nmax_size = "lots"\n', "line 2: [spool] max_size: 'lots' is not a size"),
        ('[smtp]\nmin_data_rate = "fast"\n', "line 2: [smtp] min_data_rate: 'fast' is not a data rate"),
        ("[smtp]\nmin_data_rate = -1\n", "line 2: [smtp] min_data_rate: -1 is not a data rate"),
        ('[spool]\nmax_size = "10 XB"\n', "line 2: [spool] max_size: '10 XB' is not a size"),
        ("[spool]\nmax_size = true\n", 'line 2: [spool] max_size: expected a size such as "25MiB", got true'),
        (
            '[smtp]\nrelay_networks = ["10.0.0.0/8", "bogus"]\n',
            "line 2: [smtp] relay_networks: 'bogus' is not an IP network",
        ),
        ('[http]\nlisten = "localhost"\n', "line 2: [http] listen: 'localhost' is not host:port"),
        ('[http]\nlisten = "127.0.0.1:99999"\n', "line 2: [http] listen: '127.0.0.1:99999' is not host:port"),
        (
            '[smtp]\nbare_linefeeds = "fix"\n',
            'line 2: [smtp] bare_linefeeds: expected one of "refuse", "normalise", got "fix"',
        ),
        ("[node]\nworkers = 0\n", f"line 2: [node] workers: {WORKERS}"),
        ("[node]\nworkers = 65\n", f"line 2: [node] workers: {WORKERS}"),
        (
            '[node]\nworkers = "many"\n',
            "line 2: [node] workers: 'many': must be \"auto\" or a number of worker processes from 1 to 64",
        ),
        ("[smtp]\nmax_recipients = 0\n", "line 2: [smtp] max_recipients: must be a whole number of at least 1, got 0"),
    ],
    ids=[
        "duration-unit",
        "negative-duration",
        "duration-overflowing",
        "duration-inf",
        "duration-text-overflowing",
        "size-word",
        "size-unit",
        "size-bool",
        "data-rate-word",
        "negative-data-rate",
        "network",
        "endpoint-no-port",
        "endpoint-port-range",
        "choice",
        "workers-zero",
        "workers-too-many",
        "workers-word",
        "positive-int",
    ],
)
def test_bad_value_names_the_file_line_key_and_what_is_expected(tmp_path: Path, text: str, expected: str) -> None:
    message = error_of(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'pigeon.toml'}, {expected}")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[smtp]\nlisten = ["[::ffff:127.0.0.1]:34516"]\n',
            "line 2: [smtp] listen: '[::ffff:127.0.0.1]:34516' is an IPv4-mapped IPv6 address, which no IPv6 "
            'socket can listen on: write the IPv4 address, "127.0.0.1:34516"',
        ),
        (
            '[http]\nlisten = "[::ffff:7f00:1]:8025"\n',
            "line 2: [http] listen: '[::ffff:7f00:1]:8025' is an IPv4-mapped IPv6 address, which no IPv6 socket "
            'can listen on: write the IPv4 address, "127.0.0.1:8025"',
        ),
        (
            '[smtp]\nlisten = ["::1:34516"]\n',
            "line 2: [smtp] listen: '::1:34516': write an IPv6 address in brackets, then the port: \"[::1]:34516\"",
        ),
        (
            '[http]\nlisten = "::1:8025"\n',
            "line 2: [http] listen: '::1:8025': write an IPv6 address in brackets, then the port: \"[::1]:8025\"",
        ),
    ],
    ids=["smtp-mapped", "http-mapped", "smtp-unbracketed", "http-unbracketed"],
)
def test_a_listen_address_no_socket_could_bind_is_refused_at_load_naming_the_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    # Found from outside: `serve --check` passed these, then the start failed with "cannot
    # listen: Invalid argument" (an IPv4-mapped address), or took "::1:34516" unbracketed.
    assert error_of(tmp_path, text) == f"{tmp_path / 'pigeon.toml'}, {expected}"


def test_an_ipv6_listen_address_in_brackets_is_taken(tmp_path: Path) -> None:
    config = load(write(tmp_path, '[smtp]\nlisten = ["[::1]:34516", "[::]:34517"]\n'))
    assert [(e.host, e.port) for e in config.smtp.listen] == [("::1", 34516), ("::", 34517)]


def test_certificate_without_private_key_is_refused(tmp_path: Path) -> None:
    message = error_of(tmp_path, '[smtp]\ntls_certificate = "cert.pem"\n')
    assert "tls_certificate and tls_private_key must be given together" in message


def test_private_key_without_certificate_is_refused(tmp_path: Path) -> None:
    message = error_of(tmp_path, '[smtp]\ntls_private_key = "key.pem"\n')
    assert "tls_certificate and tls_private_key must be given together" in message


@pytest.mark.parametrize(
    "text", ['[smtp]\ntls_certificate = "cert.pem"\n', "[smtp]\nmax_line_length = 10\n"], ids=["tls", "line-length"]
)
def test_consistency_errors_name_the_file(tmp_path: Path, text: str) -> None:
    assert str(tmp_path / "pigeon.toml") in error_of(tmp_path, text)


def test_worker_timeout_defaults_to_30s_and_below_2s_is_refused(tmp_path: Path) -> None:
    assert load(write(tmp_path, "")).node.worker_timeout == 30
    assert load(write(tmp_path, '[node]\nworker_timeout = "2s"\n')).node.worker_timeout == 2
    message = error_of(tmp_path, '[node]\nworker_timeout = "1500ms"\n')
    assert "line 2: [node] worker_timeout: must be at least 2 seconds" in message


def test_a_policy_timeout_of_zero_is_refused_naming_the_key(tmp_path: Path) -> None:
    for zero in ('"0s"', "0", '"0ms"'):
        message = error_of(tmp_path, f"[policy]\ntimeout = {zero}\n")
        where = f"{tmp_path / 'pigeon.toml'}, line 2"
        assert message == f'{where}: [policy] timeout: must be more than 0 (e.g. "2s", "250ms")'
    assert load(write(tmp_path, '[policy]\ntimeout = "1ms"\n')).policy.timeout == 0.001


def test_line_length_below_78_is_refused(tmp_path: Path) -> None:
    assert "[smtp] max_line_length: must be at least 78" in error_of(tmp_path, "[smtp]\nmax_line_length = 77\n")
    assert load(write(tmp_path, "[smtp]\nmax_line_length = 78\n")).smtp.max_line_length == 78


def test_a_line_length_leaving_no_room_for_a_message_id_naming_the_hostname_is_refused(tmp_path: Path) -> None:
    """Injected mail gets a Message-ID naming the host, which cannot be folded: under a limit
    too low for it every injection would be refused by the node's own content check."""
    host = "mx." + "h" * 50  # 53 octets: its Message-ID line, folded and shortened, is 79
    message = error_of(tmp_path, f'[smtp]\nhostname = "{host}"\nmax_line_length = 78\n')
    assert f"[smtp] max_line_length: is 78: a Message-ID naming [smtp] hostname ('{host}') on a line of" in message
    assert "takes 79 octets; set it to 79 or more, or a shorter hostname" in message
    assert load(write(tmp_path, f'[smtp]\nhostname = "{host}"\nmax_line_length = 79\n')).smtp.max_line_length == 79
    assert load(write(tmp_path, f'[smtp]\nhostname = "{host[1:]}"\nmax_line_length = 78\n')).smtp.hostname


def test_empty_listen_list_is_refused(tmp_path: Path) -> None:
    assert "[smtp] listen: name at least one address" in error_of(tmp_path, "[smtp]\nlisten = []\n")


def test_smtp_listen_takes_one_address_as_a_string(tmp_path: Path) -> None:
    config = load(write(tmp_path, '[smtp]\nlisten = "0.0.0.0:25"\n'))
    assert [(e.host, e.port) for e in config.smtp.listen] == [("0.0.0.0", 25)]


def test_http_listen_given_a_list_says_to_give_one_address_as_a_string(tmp_path: Path) -> None:
    message = error_of(tmp_path, '[http]\nlisten = ["127.0.0.1:9000"]\n')
    assert message == (
        f"{tmp_path / 'pigeon.toml'}, line 2: [http] listen: "
        'takes one address as a string, not a list: listen = "127.0.0.1:9000"'
    )


@pytest.mark.parametrize(
    ("line", "key", "what"),
    [
        ('tls_certificate = "cert.pem"\ntls_private_key = "key.pem"', "[smtp] tls_certificate", "cert.pem"),
        ('tls_certificate = "key.pem"\ntls_private_key = "cert.pem"', "[smtp] tls_private_key", "cert.pem"),
    ],
)
def test_missing_tls_files_are_named_when_the_config_loads(tmp_path: Path, line: str, key: str, what: str) -> None:
    (tmp_path / "key.pem").touch()
    message = error_of(tmp_path, f"[smtp]\n{line}\n")
    assert f"{key}: " in message
    assert f"{tmp_path / what} does not exist" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[spool]\npath = "afile"\n', "line 2: [spool] path: {d}/afile is a file, not a directory"),
        ('[log]\npath = "afile/sub"\n', "line 2: [log] path: {d}/afile/sub cannot be made: {d}/afile is a file"),
    ],
)
def test_a_spool_or_log_path_a_file_stands_in_is_named_when_the_config_loads(
    tmp_path: Path, text: str, expected: str
) -> None:
    """Not `[Errno 17] File exists` from the start, naming no key (a new directory is fine)."""
    (tmp_path / "afile").touch()
    assert expected.format(d=tmp_path) in error_of(tmp_path, text)
    assert load(write(tmp_path, '[log]\npath = "new/sub"\n')).log.path == tmp_path / "new" / "sub"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[smtp]\nlisten = ["127.0.0.1:2600", "127.0.0.1:2600"]\n',
            "line 2: [smtp] listen: 127.0.0.1:2600 is listed twice: each address is listened on once",
        ),
        (
            '[smtp]\nlisten = ["127.0.0.1:2600"]\n[http]\nlisten = "127.0.0.1:2600"\n',
            "line 4: [http] listen: 127.0.0.1:2600 is also [smtp] listen: each address is listened on once",
        ),
        (
            '[smtp]\nlisten = ["[::1]:2600", "[0:0::1]:2600"]\n',
            "line 2: [smtp] listen: [0:0::1]:2600 is listed twice (as [::1]:2600): each address is listened on once",
        ),
        (
            '[smtp]\nlisten = ["0.0.0.0:2600", "127.0.0.2:2600"]\n',
            "line 2: [smtp] listen: 127.0.0.2:2600 and 0.0.0.0:2600 share a port, which a wildcard takes on every",
        ),
    ],
)
def test_an_address_the_config_listens_on_twice_is_named_when_it_loads(
    tmp_path: Path, text: str, expected: str
) -> None:
    """Not "the port is in use (by another node, or another program)" at the start."""
    assert expected in error_of(tmp_path, text)


def test_the_same_port_on_other_addresses_or_families_is_no_conflict(tmp_path: Path) -> None:
    text = '[smtp]\nlisten = ["0.0.0.0:2600", "[::]:2600", "127.0.0.1:2601"]\n[http]\nlisten = "[::1]:2601"\n'
    assert len(load(write(tmp_path, text)).smtp.listen) == 3


TLS_PAIR = '[smtp]\ntls_certificate = "cert.pem"\ntls_private_key = "key.pem"\n'


def test_a_real_certificate_and_its_key_load(tmp_path: Path) -> None:
    write_pair(tmp_path / "cert.pem", tmp_path / "key.pem")
    assert load(write(tmp_path, TLS_PAIR)).smtp.tls_certificate == tmp_path / "cert.pem"


def test_a_certificate_file_that_holds_no_certificate_is_refused_at_load(tmp_path: Path) -> None:
    write_pair(tmp_path / "cert.pem", tmp_path / "key.pem")
    (tmp_path / "cert.pem").write_text("-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n")
    message = error_of(tmp_path, TLS_PAIR)
    assert "line 2: [smtp] tls_certificate: " in message
    assert f"{tmp_path / 'cert.pem'} holds no PEM certificate" in message


def test_a_key_file_that_holds_no_key_is_refused_at_load(tmp_path: Path) -> None:
    write_pair(tmp_path / "cert.pem", tmp_path / "key.pem")
    (tmp_path / "key.pem").write_text("garbage\n")
    message = error_of(tmp_path, TLS_PAIR)
    assert "line 3: [smtp] tls_private_key: " in message
    assert f"{tmp_path / 'key.pem'} holds no PEM private key" in message


def test_a_key_that_is_not_the_certificates_is_refused_at_load(tmp_path: Path) -> None:
    write_pair(tmp_path / "cert.pem", tmp_path / "key.pem")
    write_pair(tmp_path / "other.pem", tmp_path / "other-key.pem")
    message = error_of(tmp_path, TLS_PAIR.replace('"key.pem"', '"other-key.pem"'))
    assert "[smtp] tls_private_key: " in message
    assert f"{tmp_path / 'other-key.pem'} is not the key of the certificate in {tmp_path / 'cert.pem'}" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_key_is_refused_at_load(tmp_path: Path) -> None:
    write_pair(tmp_path / "cert.pem", tmp_path / "key.pem")
    (tmp_path / "key.pem").chmod(0)
    message = error_of(tmp_path, TLS_PAIR)
    assert f"[smtp] tls_private_key: cannot read {tmp_path / 'key.pem'}: Permission denied" in message


def test_an_encrypted_key_is_refused_at_load(tmp_path: Path) -> None:
    write_pair(tmp_path / "cert.pem", tmp_path / "key.pem")
    key = serialization.load_pem_private_key((tmp_path / "key.pem").read_bytes(), password=None)
    locked = serialization.BestAvailableEncryption(b"secret")
    pkcs8 = serialization.PrivateFormat.PKCS8
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, pkcs8, locked))
    message = error_of(tmp_path, TLS_PAIR)
    assert f"[smtp] tls_private_key: {tmp_path / 'key.pem'} is encrypted" in message


def test_auth_users_without_starttls_is_refused_naming_both_settings(tmp_path: Path) -> None:
    (tmp_path / "users").touch()
    text = '[smtp]\nstarttls = false\nauth_users = "users"\n'
    message = error_of(tmp_path, text)
    assert "line 3: [smtp] auth_users: is set but [smtp] starttls = false" in message
    assert "passwords would cross the network in clear" in message
    assert "allow_plaintext_auth = true" in message
    config = load(write(tmp_path, text + "allow_plaintext_auth = true\n"))  # said explicitly: taken
    assert config.smtp.auth_users == tmp_path / "users" and not config.smtp.starttls


def test_a_users_file_with_a_line_no_user_can_log_in_with_is_refused_at_load_naming_the_key(tmp_path: Path) -> None:
    """As a DKIM key's: said when the node starts (exit 2) and when a reload reads it, naming
    `[smtp] auth_users` and the file's line, not first when a worker starts (exit 1, no key)."""
    (tmp_path / "users").write_text("# the node's users\njunk\n")
    message = error_of(tmp_path, '[smtp]\nauth_users = "users"\n')
    assert f"line 2: [smtp] auth_users: {tmp_path / 'users'}, line 2: expected user:$scrypt$..." in message
    (tmp_path / "users").write_text("")
    assert load(write(tmp_path, '[smtp]\nauth_users = "users"\n')).smtp.auth_users == tmp_path / "users"


def test_two_api_tokens_with_the_same_secret_are_refused(tmp_path: Path) -> None:
    token = '[[http.token]]\nname = "{}"\ntoken = "{}"\nscopes = ["{}"]\n'
    same = "a" * 32
    text = token.format("reader", same, "read") + token.format("operator", "b" * 32, "admin")
    assert [t.name for t in load(write(tmp_path, text)).http.token] == ["reader", "operator"]
    message = error_of(tmp_path, text + token.format("deployer", same, "admin"))
    assert "line 11: [[http.token]] #3 token: " in message
    assert "'deployer' has the same secret as 'reader'" in message
    assert same not in message  # the secret is not shown


@pytest.mark.parametrize(
    ("section", "key"),
    [('[delivery]\nca_file = "ca.pem"', "[delivery] ca_file"),
     ('[[route]]\ndomain = "*"\ntls_verify = true\nca_file = "ca.pem"', "[[route]] #1 ca_file")],
)  # fmt: skip
def test_a_delivery_ca_file_is_read_beside_the_config_and_must_hold_certificates(
    tmp_path: Path, section: str, key: str
) -> None:
    assert f"{tmp_path / 'ca.pem'} does not exist" in error_of(tmp_path, f"{section}\n")
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    message = error_of(tmp_path, f"{section}\n")
    assert f"{key}: " in message and "holds no PEM certificate" in message, message
    certificate, _ = ensure_self_signed(tmp_path / "certs", "smarthost.test")
    shutil.copy(certificate, tmp_path / "ca.pem")
    config = load(write(tmp_path, f"{section}\n"))
    assert tmp_path / "ca.pem" in (config.delivery.ca_file, *(route.ca_file for route in config.route))


_WEBHOOK_UNDER_A_PRIVATE_CA = """\
[[target]]
name = "jobs"
kind = "maildir"
path = "Maildir"

[[target]]
name = "hook"
kind = "webhook"
url = "https://helpdesk.internal/inbound"
ca_file = "ca.pem"
"""


def test_a_webhook_ca_file_is_read_beside_the_config_and_must_hold_certificates(tmp_path: Path) -> None:
    message = error_of(tmp_path, _WEBHOOK_UNDER_A_PRIVATE_CA)
    assert message.startswith(f"{tmp_path / 'pigeon.toml'}, line 10: [[target]] #2 ca_file: "), message
    assert f"target 'hook': CA file {tmp_path / 'ca.pem'} does not exist" in message, message
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    message = error_of(tmp_path, _WEBHOOK_UNDER_A_PRIVATE_CA)
    assert "line 10: [[target]] #2 ca_file: target 'hook': CA file" in message, message
    assert "holds no PEM certificate" in message, message
    certificate, _ = ensure_self_signed(tmp_path / "certs", "helpdesk.internal")
    shutil.copy(certificate, tmp_path / "ca.pem")
    (_, webhook) = load(write(tmp_path, _WEBHOOK_UNDER_A_PRIVATE_CA)).target
    assert isinstance(webhook, WebhookTarget)
    assert webhook.ca_file == tmp_path / "ca.pem" and webhook.tls_verify


def test_a_webhook_ca_file_is_checked_by_a_worker_started_after_a_reload(tmp_path: Path) -> None:
    # A reload does not take [[target]]s: the worker runs this file's, so its CA must be there.
    path = write(tmp_path, _WEBHOOK_UNDER_A_PRIVATE_CA)
    with pytest.raises(ConfigError, match=r"\[\[target\]\] #2 ca_file: target 'hook': CA file .* does not exist"):
        load_text(path.read_text(), path, replaced_by_reload=True)


def test_invalid_toml_names_the_file_and_the_line(tmp_path: Path) -> None:
    message = error_of(tmp_path, '[node]\nname = "a"\n[smtp\nlisten = 1\n')
    assert message.startswith(f"{tmp_path / 'pigeon.toml'}: not valid TOML: ")
    assert "line 3" in message


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the configuration file") as caught:
        load(tmp_path / "absent.toml")
    assert str(tmp_path / "absent.toml") in str(caught.value)


INBOUND = """
[[target]]
name = "hook"
kind = "webhook"
url = "http://127.0.0.1:9/in"

[[mailbox]]
name = "support"
host = "imap.example.com"
username = "app"
password = "secret"
target = "hook"
"""


def test_inbound_sections_parse_with_their_defaults(tmp_path: Path) -> None:
    config = load(write(tmp_path, INBOUND + '[[inbound]]\ndomain = "app.example"\ntarget = "hook"\n'))
    (mailbox,) = config.mailbox
    assert (mailbox.tls, mailbox.folder, mailbox.search, mailbox.after_delivery) == (
        "implicit",
        "INBOX",
        "UNSEEN",
        "seen",
    )
    assert config.target[0].name == "hook" and config.inbound[0].domain == "app.example"
    assert config.redis.url is None  # single-node mode


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('[[inbound]]\nrecipient = "a@b.example"\ntarget = "nope"\n', "no [[target]] called 'nope' (known: 'hook')"),
        ('[[inbound]]\ntarget = "hook"\n', "exactly one of recipient or domain"),
        (
            '[[inbound]]\ntarget = "hook"\nrecipient = "a@b.example"\ndomain = "b.example"\n',
            "line 15: [[inbound]] #1 recipient: give each [[inbound]] route exactly one of recipient or domain",
        ),
        ('[[target]]\nname = "hook"\nkind = "log"\npath = "x"\n', "two [[target]]s are called 'hook'"),
        (
            "[[mailbox]]" + INBOUND.split("[[mailbox]]")[1].replace("support", "other"),
            "line 14: [[mailbox]] #2 name: mailbox 'other' watches the folder 'INBOX' of app@imap.example.com "
            "that mailbox 'support' watches already",
        ),
        (
            '[[target]]\nname = "jobs"\nkind = "sidekiq"\nredis_url = "redis//127.0.0.1:6379"\n',
            "line 16: [[target]] #2 redis_url: target 'jobs': no scheme: it must start with redis://",
        ),
        (
            '[[target]]\nname = "rows"\nkind = "postgresql"\ndsn = "mysql://u@h/db"\n',
            "line 16: [[target]] #2 dsn: target 'rows': give the DSN as a URL (postgresql://",
        ),
    ],
)
def test_inbound_configuration_mistakes_are_named(tmp_path: Path, extra: str, expected: str) -> None:
    assert expected in error_of(tmp_path, INBOUND + extra)


def test_a_mysql_dsn_is_not_called_key_value(tmp_path: Path) -> None:
    said = error_of(tmp_path, INBOUND + '[[target]]\nname = "rows"\nkind = "postgresql"\ndsn = "mysql://u@h/db"\n')
    assert "mysql:// is not PostgreSQL's" in said and "key=value" not in said


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("127.0.0.1:6379", "no scheme: it must start with redis://, rediss:// or unix://"),
        ("http://127.0.0.1:6379/0", "scheme http:// is not redis://"),
        ("redis://127.0.0.1:port/0", "not a Redis URL: what follows the host's ':' is no port number"),
        ("redis://:secret@127.0.0.1:99999/0", "not a Redis URL: the port is out of range (a port to connect to is 1"),
        ("redis:///0", "no host"),
        ("redis://127.0.0.1:6379/queue", "must be a database number"),
        ("unix://", "needs the socket's path"),
    ],
)
def test_a_redis_url_the_client_would_refuse_is_a_configuration_error(tmp_path: Path, url: str, expected: str) -> None:
    said = error_of(tmp_path, f'[redis]\nurl = "{url}"\n')
    assert said.startswith(f"{tmp_path / 'pigeon.toml'}, line 2: [redis] url: ") and expected in said, said
    assert "secret" not in said


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "rediss://user:pw@cache.example:6380", "unix:///run/redis.sock?db=2"]
)
def test_redis_urls_the_client_takes_load(tmp_path: Path, url: str) -> None:
    assert load(write(tmp_path, f'[redis]\nurl = "{url}"\n')).redis.url == url


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('after_delivery = "move"', '"move" needs move_to'),
        ('failed_folder = "INBOX"', "must differ from folder"),
        ('lease = "0s"', "at least 1 second"),
        ('search = "ALL"', "must exclude seen mail"),
        ('auth = "kerberos"', 'expected one of "login", "xoauth2", got "kerberos"'),
        ('ca_file = "ca.pem"', "[[mailbox]] #1 ca_file: mailbox 'support': CA file"),
    ],
)
def test_mailbox_mistakes_are_named(tmp_path: Path, line: str, expected: str) -> None:
    assert expected in error_of(tmp_path, INBOUND + line + "\n")


def test_a_missing_password_file_is_named(tmp_path: Path) -> None:
    text = INBOUND.replace('password = "secret"', 'password_file = "secret.txt"')
    assert "[[mailbox]] #1 password_file: mailbox 'support': password file" in error_of(tmp_path, text)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"", "the token is empty"),
        (b"\nthe first line is the token\n", "the token is empty"),
        ("ya29.tökén\n".encode(), "the token holds a character that is not ASCII (at position 7 of 10)"),
        (b"ya29.\xff\n", "the token holds bytes that are not UTF-8 text"),
    ],
    ids=["empty", "empty-first-line", "not-ascii", "not-utf-8"],
)
def test_an_xoauth2_token_file_whose_token_cannot_be_sent_is_refused_at_load(
    tmp_path: Path, content: bytes, said: str
) -> None:
    # Found from outside: an empty token file was sent as an empty token (refused as a wrong
    # one), and a token with a character that is not ASCII raised a bare UnicodeEncodeError.
    (tmp_path / "token").write_bytes(content)
    text = INBOUND.replace('password = "secret"', 'auth = "xoauth2"\npassword_file = "token"')
    expected = (
        f"[[mailbox]] #1 password_file: mailbox 'support': auth = \"xoauth2\": password_file {tmp_path / 'token'} "
        f"holds the access token, and {said}"
    )
    assert expected in error_of(tmp_path, text)
    (tmp_path / "token").write_bytes(content)
    assert load(
        write(tmp_path, text.replace('auth = "xoauth2"', 'auth = "login"'))
    ).mailbox  # a password may be anything


@pytest.mark.parametrize(
    ("password", "said"),
    [("", "the token is empty"), ("tök", "the token holds a character that is not ASCII (at position 2 of 3)")],
)
def test_an_xoauth2_token_in_password_that_cannot_be_sent_is_refused_at_load(
    tmp_path: Path, password: str, said: str
) -> None:
    text = INBOUND.replace('password = "secret"', f'auth = "xoauth2"\npassword = "{password}"')
    said_first = (
        "[[mailbox]] #1 password: mailbox 'support': auth = \"xoauth2\" takes an OAuth2 access token as password"
    )
    assert f"{said_first}, and {said}" in error_of(tmp_path, text)


# A second mailbox, so that the line named is that of the mailbox at fault, not the first one's.
OTHER = "\n[[mailbox]]" + INBOUND.split("[[mailbox]]")[1].replace("support", "other").replace("app", "app2")


@pytest.mark.parametrize(
    ("lines", "key", "expected"),
    [
        (
            'password_file = "secret.txt"',
            "password_file",
            "mailbox 'other': give password or password_file, not both",
        ),
        (
            'after_delivery = "delete"\nmove_to = "Processed"',
            "move_to",
            'mailbox \'other\': move_to is for after_delivery = "move", and after_delivery is "delete" (messages '
            'handed over are deleted): remove move_to, or set after_delivery = "move"',
        ),
        (
            'move_to = "Processed"',
            "move_to",
            'after_delivery is "seen" (messages handed over are flagged \\Seen and left in the folder)',
        ),
    ],
)
def test_contradictory_mailbox_settings_are_refused_at_their_line(
    tmp_path: Path, lines: str, key: str, expected: str
) -> None:
    (tmp_path / "secret.txt").write_text("secret\n")
    text = INBOUND + OTHER + lines + "\n"
    said = error_of(tmp_path, text)
    last = len(text.splitlines())  # where `key` is, in the second mailbox
    assert said.startswith(f"{tmp_path / 'pigeon.toml'}, line {last}: [[mailbox]] #2 {key}: "), said
    assert expected in said, said


@pytest.mark.parametrize(
    "search",
    [
        "UNSEEN",
        "NOT SEEN",
        "FLAGGED NOT SEEN",
        "OR (UNSEEN FLAGGED) (UNSEEN DRAFT)",
        "NOT OR SEEN DRAFT",
        'HEADER X-Ticket "a b" UNSEEN',
        'X-GM-RAW "in:inbox" unseen',
    ],
)
def test_a_search_that_by_its_meaning_excludes_seen_mail_loads_with_after_delivery_seen(
    tmp_path: Path, search: str
) -> None:
    line = f"search = '{search}'\n"  # a TOML literal string: the double quotes are the search's
    assert load(write(tmp_path, INBOUND + line)).mailbox[0].search == search


@pytest.mark.parametrize(
    ("search", "expected"),
    [
        ("OR UNSEEN FLAGGED", "and 'OR UNSEEN FLAGGED' can match it: add UNSEEN (or NOT SEEN) outside any OR, or use"),
        ("NOT (UNSEEN FLAGGED)", "and 'NOT (UNSEEN FLAGGED)' can match it: add UNSEEN"),
        ("SEEN", "and 'SEEN' can match it"),
        ("OR UNSEEN", "Pigeon cannot read 'OR UNSEEN': OR needs two search keys; fix the search, or use"),
        ("(UNSEEN", "cannot read '(UNSEEN': a parenthesis is not closed"),
        ("FOO UNSEEN", "cannot read 'FOO UNSEEN': 'FOO' is not a search key Pigeon knows (RFC 3501 6.4.4)"),
    ],
)
def test_a_search_that_can_match_seen_mail_is_refused_with_after_delivery_seen(
    tmp_path: Path, search: str, expected: str
) -> None:
    said = error_of(tmp_path, INBOUND + f'search = "{search}"\n')
    assert ", line 13: [[mailbox]] #1 search: mailbox 'support': with after_delivery = \"seen\" the search must" in said
    assert expected in said, said
    assert said.endswith('"move" or "delete"'), said


@pytest.mark.parametrize(
    ("search", "key", "after_delivery"),
    [
        ("NEW", "NEW", "seen"),
        ("new", "NEW", "delete"),
        ("RECENT UNSEEN", "RECENT", "seen"),
        ("OR (UNSEEN FLAGGED) NEW", "NEW", "seen"),
        ("OLD", "OLD", "delete"),
        ("NOT RECENT", "RECENT", "delete"),
    ],
)
def test_a_search_that_depends_on_recent_is_refused_at_load_saying_to_use_unseen(
    tmp_path: Path, search: str, key: str, after_delivery: str
) -> None:
    # Found from outside (mail_room's README suggests NEW): a message refused for now and still
    # waiting at a stop or reconnect loses \Recent, and NEW never found it again.
    said = error_of(tmp_path, INBOUND + f'after_delivery = "{after_delivery}"\nsearch = "{search}"\n')
    assert f"[[mailbox]] #1 search: mailbox 'support': '{search}' depends on \\Recent ({key})" in said, said
    assert said.endswith("use UNSEEN instead (NEW is RECENT UNSEEN)"), said


def test_an_idle_longer_than_29_minutes_is_refused_at_load(tmp_path: Path) -> None:
    # Found from outside: "2h" loaded silently; RFC 2177 asks to re-IDLE at least every 29 minutes.
    said = error_of(tmp_path, INBOUND + 'poll_interval = "2h"\n')
    assert "[[mailbox]] #1 poll_interval: mailbox 'support': with idle = true, poll_interval is also" in said, said
    assert said.endswith('set at most "29m", or idle = false to poll this seldom'), said
    assert load(write(tmp_path, INBOUND + 'poll_interval = "29m"\n')).mailbox[0].poll_interval == 29 * 60
    assert load(write(tmp_path, INBOUND + 'idle = false\npoll_interval = "2h"\n')).mailbox[0].poll_interval == 7200


def test_postmaster_defaults_to_postmaster_at_the_hostname_and_must_be_a_mailbox(tmp_path: Path) -> None:
    assert load(write(tmp_path, '[smtp]\nhostname = "mx.example.org"\n')).smtp.postmaster == "postmaster@mx.example.org"
    given = load(write(tmp_path, '[smtp]\npostmaster = "ops@example.org"\n'))
    assert given.smtp.postmaster == "ops@example.org"
    with pytest.raises(ConfigError, match=r"line 2: \[smtp\] postmaster: .*"):
        load(write(tmp_path, '[smtp]\npostmaster = "not an address"\n'))


def test_a_file_that_is_not_utf8_is_a_config_error_naming_the_line(tmp_path: Path) -> None:
    # Found by fuzzing (tests/fuzz/targets/config_loader.py): a UnicodeDecodeError traceback.
    path = tmp_path / "pigeon.toml"
    path.write_bytes(b'[node]\nname = "caf\xe9"\n')
    with pytest.raises(ConfigError) as error:
        load(path)
    assert str(error.value) == f"{path}, line 2: not UTF-8 text (TOML files are UTF-8)"


@pytest.mark.parametrize("line", ['kind = "webhok"\n', ""], ids=["misspelt", "missing"])
def test_a_wrong_target_kind_lists_the_valid_kinds(tmp_path: Path, line: str) -> None:
    message = error_of(tmp_path, f'[[target]]\nname = "x"\n{line}url = "http://127.0.0.1:9/"\n')
    assert "[[target]] #1 kind: " in message
    assert 'one of "sidekiq", "webhook", "postgresql", "maildir", "log"' in message


def test_a_postgresql_dsn_in_key_value_form_is_refused_at_load_with_the_url_form(tmp_path: Path) -> None:
    """asyncpg takes only URLs: the libpq form loaded, then failed at every handoff, forever."""
    dsn = "host=127.0.0.1 port=5432 user=app password='s3cret' dbname=db"
    message = error_of(tmp_path, f'[[target]]\nname = "pg"\nkind = "postgresql"\ndsn = "{dsn}"\n')
    assert "[[target]] #1 dsn: " in message and "as a URL (postgresql://user@host:5432/database" in message
    assert "s3cret" not in message


def test_a_policy_module_named_like_a_file_beside_the_config_is_that_file(tmp_path: Path) -> None:
    # `module = "mypolicy"` with mypolicy.py next to pigeon.toml, as a user writes it.
    (tmp_path / "mypolicy.py").write_text("def on_connect(connection):\n    return None\n")
    assert load(write(tmp_path, '[policy]\nmodule = "mypolicy"\n')).policy.module == str(tmp_path / "mypolicy.py")
    # The file beside the config wins over a module of that name on sys.path (the standard
    # library's mailbox defines no hooks); a name that is neither is left to fail at load with
    # Python's own message.
    (tmp_path / "mailbox.py").write_text("")
    assert load(write(tmp_path, '[policy]\nmodule = "mailbox"\n')).policy.module == str(tmp_path / "mailbox.py")
    assert load(write(tmp_path, '[policy]\nmodule = "json"\n')).policy.module == "json"
    assert load(write(tmp_path, '[policy]\nmodule = "nowhere.policy"\n')).policy.module == "nowhere.policy"


def test_a_dotted_policy_module_beside_the_config_imports_its_package_without_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # acme/policy.py beside pigeon.toml: loaded as a lone file, its `from . import helpers`
    # failed ("attempted relative import with no known parent package"), and its `from
    # review2acme import util` unless PYTHONPATH named the config's directory.
    monkeypatch.setattr(sys, "path", list(sys.path))  # the config's directory is put on it
    package = tmp_path / "review2acme"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("ANSWER = 'helpers'\n")
    (package / "util.py").write_text("ANSWER = 'util'\n")
    source = "from . import helpers\nfrom review2acme import util\n\ndef on_connect(c):\n"
    source += "    return helpers.ANSWER + util.ANSWER\n"
    (package / "policy.py").write_text(source)
    path = write(tmp_path, '[policy]\nmodule = "review2acme.policy"\n')
    config = load(path)
    assert config.policy.module == "review2acme.policy"
    try:
        policy = Policy.from_config(config.policy, warn=False, config_path=path)
        assert policy.on_connect is not None and policy.on_connect.function(None) == "helpersutil"
        policy.close()
    finally:
        for name in [n for n in sys.modules if n.startswith("review2acme")]:
            del sys.modules[name]


def test_a_policy_file_imports_the_files_beside_it_as_a_script_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # the policy's directory is put on it
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "review2helper.py").write_text("ANSWER = 'helper'\n")
    mypolicy = "import review2helper\n\ndef on_connect(c):\n    return review2helper.ANSWER\n"
    (policies / "mypolicy.py").write_text(mypolicy)
    (tmp_path / "review2near.py").write_text("ANSWER = 'near'\n")
    (tmp_path / "near.py").write_text("import review2near\n\ndef on_connect(c):\n    return review2near.ANSWER\n")
    try:
        for module, answer in (("policies/mypolicy.py", "helper"), ("near", "near")):
            path = write(tmp_path, f'[policy]\nmodule = "{module}"\n')
            policy = Policy.from_config(load(path).policy, warn=False, config_path=path)
            assert policy.on_connect is not None and policy.on_connect.function(None) == answer
            policy.close()
    finally:
        for name in [n for n in sys.modules if n.startswith("review2")]:
            del sys.modules[name]
