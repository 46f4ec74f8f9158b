"""Values that load as the right type but would break or mislead later: a name that cannot go
on the wire, a duration or size of 0, a backoff whose ceiling is below its first interval, an
API token no record could tell apart. Each is refused at load (so at start-up, exit 2, and at a
reload, which keeps the running config), naming the file, the line and the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pigeon.config.load import ConfigError, load
from pigeon.smtp.client_session import ClientSession


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pigeon.toml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load(write(tmp_path, text))
    return str(caught.value)


SOURCE = '[[source]]\nname = "ip-2"\nbind = "127.0.0.2"\nehlo = {}\n'
NAME_SETTINGS = {
    "hostname": ("[smtp]\nhostname = {}\n", "line 2: [smtp] hostname: "),
    "helo_name": ("[delivery]\nhelo_name = {}\n", "line 2: [delivery] helo_name: "),
    "source-ehlo": (SOURCE, "line 4: [[source]] #1 ehlo: source 'ip-2': "),
}
BAD_NAMES = {
    "space": ('"bad host"', "holds white space or a control character"),
    "crlf": ('"evil.test\\r\\nX-Injected: yes"', "holds white space or a control character"),
    "control": ('"x\\u0001y"', "holds white space or a control character"),
    "non-ascii": ('"mx.exämple.org"', "holds a character that is not ASCII"),
    "punctuation": ('"mx!.example.org"', "is not a domain name"),
    "bad-literal": ('"[mx.example.org]"', "is not an address literal"),
    "v6-literal-without-tag": ('"[2001:db8::1]"', "is not an address literal"),
    "too-long": (f'"{"a" * 63}.{"b" * 63}.{"c" * 63}.{"d" * 63}.example"', "longer than a domain name may be"),
    # `EHLO 192.0.2.1` is no RFC 5321 greeting: an address goes in brackets.
    "bare-ipv4": ('"192.0.2.1"', 'is an IP address: write it as an address literal, "[192.0.2.1]"'),
    "bare-ipv6": ('"2001:db8::1"', 'is an IP address: write it as an address literal, "[IPv6:2001:db8::1]"'),
    # A host name's last label is never all digits (RFC 1123 2.1, RFC 3696 2): those read as addresses.
    "bare-ipv4-rooted": ('"192.0.2.1."', 'is an IP address: write it as an address literal, "[192.0.2.1]"'),
    "all-numeric-last-label": (
        '"1.2.3"',
        'is not a host name: its last label, "3", is all digits, as only an IP address\'s is (RFC 1123 2.1):'
        ' write an address as an address literal, like "[192.0.2.1]"',
    ),
    "hex-and-numeric": ('"0x7f.1"', 'is not a host name: its last label, "1", is all digits'),
    "all-numeric-rooted": ('"mx.example.123."', 'is not a host name: its last label, "123", is all digits'),
}


@pytest.mark.parametrize("setting", NAME_SETTINGS, ids=list(NAME_SETTINGS))
@pytest.mark.parametrize("bad", BAD_NAMES, ids=list(BAD_NAMES))
def test_a_name_pigeon_would_give_on_the_wire_is_refused_at_load(tmp_path: Path, setting: str, bad: str) -> None:
    # They used to load: the banner then broke every SMTP connection (a line break), or every
    # delivery raised "not a name to greet with" and no mail ever left.
    template, where = NAME_SETTINGS[setting]
    value, why = BAD_NAMES[bad]
    message = error_of(tmp_path, template.format(value))
    assert message.startswith(f"{tmp_path / 'pigeon.toml'}, {where}")
    assert why in message


def test_an_empty_hostname_is_refused_at_load(tmp_path: Path) -> None:
    assert "line 2: [smtp] hostname: '' is empty" in error_of(tmp_path, '[smtp]\nhostname = ""\n')


@pytest.mark.parametrize(
    "name", ["mx.example.org", "mx.example.org.", "mail_1.example", "123.example", "mx.1a", "[192.0.2.1]", "[IPv6:::1]"]
)
def test_domain_names_and_address_literals_load_as_names_on_the_wire(tmp_path: Path, name: str) -> None:
    config = load(
        write(tmp_path, f'[smtp]\nhostname = "{name}"\n[delivery]\nhelo_name = "{name}"\n' + SOURCE.format(f'"{name}"'))
    )
    assert (config.smtp.hostname, config.delivery.helo_name, config.source[0].ehlo) == (name, name, name)
    ClientSession(name)  # and the SMTP client greets with it


@pytest.mark.parametrize(
    "setting",
    [
        "[smtp]\nidle_timeout = {}",
        "[smtp]\ncommand_timeout = {}",
        "[smtp]\nauth_failure_window = {}",
        "[smtp]\nauth_lockout = {}",
        "[http]\nmax_render_time = {}",
        "[http]\nheader_timeout = {}",
        "[http]\nkeepalive_timeout = {}",
        "[http]\nbody_timeout = {}",
        "[log]\nmax_segment_age = {}",
        "[delivery]\nretry_interval = {}",
        "[delivery]\nmax_retry_interval = {}",
        "[delivery]\nmax_age = {}",
        "[delivery]\nidle_timeout = {}",
        "[delivery]\nsite_retry_interval = {}",
        "[delivery]\nmax_site_retry_interval = {}",
        "[delivery]\nconnect_timeout = {}",
        "[delivery]\nreply_timeout = {}",
        "[delivery]\ndata_done_timeout = {}",
        "[dns]\ntimeout = {}",
        "[redis]\ntimeout = {}",
        "[policy]\ntimeout = {}",
        '[[queue]]\nname = "*"\nretry_interval = {}',
        '[[queue]]\nname = "*"\nmax_retry_interval = {}',
        '[[queue]]\nname = "*"\nmax_age = {}',
        '[[reaction]]\nid = "r"\nmatch = "^421"\naction = "suspend"\nduration = {}',
        '[[target]]\nname = "t"\nkind = "log"\npath = "t.log"\nretry_interval = {}',
        '[[target]]\nname = "t"\nkind = "webhook"\nurl = "http://127.0.0.1:9/"\ntimeout = {}',
    ],
)
@pytest.mark.parametrize("zero", ['"0s"', "0", '"0ms"'])
def test_a_duration_of_zero_is_refused_naming_the_key(tmp_path: Path, setting: str, zero: str) -> None:
    text = setting.format(zero) + "\n"
    section, key = text.splitlines()[0], text.splitlines()[-1].split(" = ")[0]  # "[[queue]]", "max_age"
    name = f"{section} #1" if section.startswith("[[") else section  # an array of tables: its first
    line = len(text.splitlines())
    message = error_of(tmp_path, text)
    assert message == f'{tmp_path / "pigeon.toml"}, line {line}: {name} {key}: must be more than 0 (e.g. "2s", "250ms")'


def test_a_shaping_idle_timeout_of_zero_is_refused_naming_the_block(tmp_path: Path) -> None:
    message = error_of(tmp_path, '[[shaping]]\ndomain = "a.example"\nidle_timeout = "0s"\n')
    assert "line 3: [[shaping]] #1 idle_timeout: must be more than 0" in message


@pytest.mark.parametrize(
    "setting",
    [
        "[smtp]\nmax_message_size = {}",
        "[http]\nmax_request_size = {}",
        "[spool]\nmax_size = {}",
        "[log]\nmax_segment_size = {}",
    ],
)
@pytest.mark.parametrize("zero", ['"0"', "0", '"0KiB"'])
def test_a_size_of_zero_is_refused_naming_the_key(tmp_path: Path, setting: str, zero: str) -> None:
    message = error_of(tmp_path, setting.format(zero) + "\n")
    section, key = setting.split("\n")[0].strip("[]"), setting.split("\n")[1].split(" = ")[0]
    assert f"line 2: [{section}] {key}: must be more than 0" in message


@pytest.mark.parametrize("setting", ["[smtp]\ncommand_timeout = 0", '[http]\nmax_request_size = "0"'])
def test_a_zero_is_refused_by_pigeon_shaping_check_too(tmp_path: Path, setting: str) -> None:
    from pigeon.config.load import problems

    found = problems(write(tmp_path, setting + "\n"))
    assert len(found) == 1 and "must be more than 0" in found[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[delivery]\nretry_interval = "10m"\nmax_retry_interval = "5m"\n',
            "line 3: [delivery] max_retry_interval: 300s is below retry_interval (600s)",
        ),
        (
            '[delivery]\nmax_site_retry_interval = "30s"\n',
            "line 2: [delivery] max_site_retry_interval: 30s is below site_retry_interval (60s)",
        ),
        (
            '[[target]]\nname = "t"\nkind = "log"\npath = "t.log"\nretry_interval = "1m"\nmax_retry_interval = "30s"\n',
            "line 6: [[target]] #1 max_retry_interval: 30s is below the retry_interval of target 't' (60s)",
        ),
        (
            '[[queue]]\nname = "*"\nmax_retry_interval = "1m"\n',
            "line 3: [[queue]] #1 max_retry_interval: 60s is below the retry_interval of queue '*'"
            " (from [delivery]) (300s)",
        ),
        (
            '[[queue]]\nname = "*"\nretry_interval = "6h"\n',
            "line 3: [[queue]] #1 retry_interval: queue '*': 21600s is over [delivery] max_retry_interval (14400s)",
        ),
    ],
    ids=["delivery", "site", "target", "queue-ceiling", "queue-interval"],
)
def test_a_backoff_ceiling_below_its_first_interval_is_refused(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error_of(tmp_path, text)


def test_a_backoff_ceiling_equal_to_its_first_interval_loads(tmp_path: Path) -> None:
    text = '[delivery]\nretry_interval = "1s"\nmax_retry_interval = "1s"\n'
    assert load(write(tmp_path, text)).delivery.max_retry_interval == 1
    text = '[[queue]]\nname = "*"\nretry_interval = "4h"\n'  # [delivery] max_retry_interval: 4h
    assert load(write(tmp_path, text)).queue[0].retry_interval == 4 * 3600


TOKEN = "[[http.token]]\nname = {name}\ntoken = {token}\nscopes = {scopes}\n"


def token(name: str = '"app"', secret: str = '"a0b1c2d3e4f5a6b7c8d9"', scopes: str = '["read"]') -> str:
    return TOKEN.format(name=name, token=secret, scopes=scopes)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            token() + token(secret='"ffffffffffffffffffff"'),
            "line 6: [[http.token]] #2 name: two [[http.token]]s are called 'app'",
        ),
        (token(name='""'), "line 2: [[http.token]] #1 name: '' is not a name for the holder"),
        (token(name='"app\\n"'), "line 2: [[http.token]] #1 name: 'app\\n' is not a name for the holder"),
        (
            token(name='"local"'),
            "line 2: [[http.token]] #1 name: 'local' is the name of the `pigeon` commands' local token",
        ),
        (token(scopes="[]"), "line 4: [[http.token]] #1 scopes: [[http.token]] 'app': name at least one scope"),
        (
            token(secret='"a0b1c2d3e4 f5a6b7c8d9"'),
            "line 3: [[http.token]] #1 token: [[http.token]] 'app': the secret must be",
        ),
        (
            token(secret='"a0b1c2d3e4f5a6b7c8d9\\n"'),
            "line 3: [[http.token]] #1 token: [[http.token]] 'app': the secret must be",
        ),
        (
            token() + 'tenants = ["acme", "a b"]\n',
            "line 5: [[http.token]] #1 tenants: [[http.token]] 'app': tenant 'a b' contains ' '",
        ),
        (token() + 'tenants = [""]\n', "[[http.token]] #1 tenants: [[http.token]] 'app': a tenant name is empty"),
        (
            # It used to load, a token that could do nothing, its 403s saying "bound to tenants none".
            token() + "tenants = []\n",
            "line 5: [[http.token]] #1 tenants: [[http.token]] 'app': an empty list binds the token to no tenant, "
            "so it could do nothing: name its tenants, or leave tenants out for a token of the operator's (any tenant)",
        ),
        (
            # An unbound token routes mail as any domain: a list there would seem to limit it, and not.
            token() + 'routing_domains = ["acme-relay.test"]\n',
            "line 5: [[http.token]] #1 routing_domains: [[http.token]] 'app': routing_domains limits the routing "
            "domains of a token bound to tenants; this one has no tenants",
        ),
        (
            token() + 'tenants = ["acme"]\nrouting_domains = ["a..b"]\n',
            "line 6: [[http.token]] #1 routing_domains: [[http.token]] 'app': 'a..b' has an empty label",
        ),
    ],
    ids=[
        "same-name",
        "empty-name",
        "control-in-name",
        "local",
        "no-scopes",
        "space-in-secret",
        "newline-in-secret",
        "tenant-with-space",
        "empty-tenant",
        "no-tenants",
        "routing-domains-unbound",
        "routing-domain-no-glob",
    ],
)
def test_api_token_mistakes_are_refused_naming_the_key(tmp_path: Path, text: str, expected: str) -> None:
    message = error_of(tmp_path, text)
    assert expected in message
    assert "a0b1c2d3e4" not in message  # the secret is never shown


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[delivery]\ntenant_header = "X Bad"\n',
            "line 2: [delivery] tenant_header: 'X Bad' is not a header field name",
        ),
        (
            '[delivery]\ncampaign_header = "X:Campaign"\n',
            "[delivery] campaign_header: 'X:Campaign' is not a header field",
        ),
        (
            '[delivery]\ntenant_header = ""\n',
            "line 2: [delivery] tenant_header: '' is not a header field name: it is empty",
        ),
        (
            '[delivery]\ntenant_header = "Subject"\n',
            "[delivery] tenant_header: 'Subject' is a field of the message itself",
        ),
        ('[delivery]\ncampaign_header = "x-tenant"\n', "[delivery] campaign_header: 'x-tenant' is tenant_header too"),
        (
            '[[target]]\nname = "t"\nkind = "webhook"\nurl = "http://127.0.0.1:9/"\nheaders = {"X Key" = "1"}\n',
            "line 5: [[target]] #1 headers: target 't': 'X Key' is not an HTTP header field name",
        ),
        (
            '[[target]]\nname = "t"\nkind = "webhook"\nurl = "http://127.0.0.1:9/"\n'
            'headers = {Authorization = "Bearer s3cret\\r\\nX-Evil: 1"}\n',
            "line 5: [[target]] #1 headers: target 't': the value of 'Authorization' holds a line break",
        ),
    ],
    ids=[
        "tenant-space",
        "campaign-colon",
        "tenant-empty",
        "message-field",
        "same-header",
        "webhook-name",
        "webhook-value",
    ],
)
def test_header_names_and_values_that_cannot_be_sent_are_refused(tmp_path: Path, text: str, expected: str) -> None:
    message = error_of(tmp_path, text)
    assert expected in message
    assert "s3cret" not in message


MAILBOX = """\
[[target]]
name = "hook"
kind = "webhook"
url = "http://127.0.0.1:9/in"

[[mailbox]]
name = "support"
host = "imap.example.com"
target = "hook"
"""


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            'username = "app user"\npassword = "pw"\n',
            "[[mailbox]] #1 username: mailbox 'support': 'app user' is empty or",
        ),
        ('username = "app\\r\\nA1 DELETE INBOX"\npassword = "pw"\n', "[[mailbox]] #1 username: mailbox 'support':"),
        (
            'username = "app"\npassword = "pw\\n"\n',
            "[[mailbox]] #1 password: mailbox 'support': the password holds a line",
        ),
    ],
    ids=["space-in-user", "crlf-in-user", "newline-in-password"],
)
def test_imap_credentials_that_cannot_be_sent_are_refused(tmp_path: Path, lines: str, expected: str) -> None:
    assert expected in error_of(tmp_path, MAILBOX + lines)


def test_the_smallest_spool_max_size_is_the_one_the_readme_gives(tmp_path: Path) -> None:
    # Found from outside: max_size = "600KiB" stopped the start with "must be at least 1MiB",
    # while the README's row said only "more than 0".
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    (row,) = [line for line in readme.splitlines() if line.startswith("| `[spool] max_size` |")]
    match = re.search(r"\| at least `(\d+)(\w+)`", row)
    assert match is not None, row
    smallest = int(match.group(1)) * {"KiB": 1024, "MiB": 1024 * 1024}[match.group(2)]

    assert load(write(tmp_path, f"[spool]\nmax_size = {smallest}\n")).spool.max_size == smallest
    assert "[spool] max_size: must be at least" in error_of(tmp_path, f"[spool]\nmax_size = {smallest - 1}\n")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[[route]]\ndomain = "a.example"\nnext_hop = "127.0.0.1:0"\n',
            "line 3: [[route]] #1 next_hop: '127.0.0.1:0': port 0 is no server's; a port to connect to is 1 to 65535",
        ),
        (
            '[[route]]\ndomain = "a.example"\nnext_hop = "mx.example.net"\n',
            "line 3: [[route]] #1 next_hop: 'mx.example.net' is not host:port: name the server's port too, "
            "like 'mx.example.net:25'",
        ),
        (
            '[[route]]\ndomain = "a.example"\nnext_hop = "::1:2525"\n',
            "line 3: [[route]] #1 next_hop: '::1:2525': write an IPv6 address in brackets, then the port",
        ),
        (
            '[dns]\nnameservers = ["127.0.0.1:0"]\n',
            "line 2: [dns] nameservers: '127.0.0.1:0': port 0 is no server's; a port to connect to is 1 to 65535",
        ),
        (
            '[dns]\nnameservers = ["127.0.0.1"]\n',
            "line 2: [dns] nameservers: '127.0.0.1' is not host:port: name the server's port too, like '127.0.0.1:53'",
        ),
        (
            # Found from outside: it passed `serve --check` with [dane] off, and the start (or,
            # with [dane] on, `--check` itself) failed with a traceback from the listener rule.
            '[dns]\nnameservers = ["[::ffff:127.0.0.1]:53"]\n',
            "line 2: [dns] nameservers: '[::ffff:127.0.0.1]:53' is an IPv4-mapped IPv6 address: write the IPv4 "
            'address, "127.0.0.1:53"',
        ),
        (
            '[[target]]\nkind = "postgresql"\nname = "rows"\ndsn = "postgresql://app@db.example:0/mail"\n',
            "line 4: [[target]] #1 dsn: target 'rows': port 0 is no server's; a port to connect to is 1 to 65535",
        ),
        (
            '[redis]\nurl = "redis://127.0.0.1:0/0"\n',
            "line 2: [redis] url: port 0 is no server's; a port to connect to is 1 to 65535",
        ),
    ],
    ids=[
        "next-hop-port-0",
        "next-hop-no-port",
        "next-hop-bare-ipv6",
        "nameserver-port-0",
        "nameserver-no-port",
        "nameserver-ipv4-mapped",
        "postgresql-port-0",
        "redis-port-0",
    ],
)
def test_an_address_pigeon_connects_to_needs_a_port_from_1(tmp_path: Path, text: str, expected: str) -> None:
    # Found from outside: next_hop = "127.0.0.1:0" passed `pigeon shaping check`, and a next hop
    # with no port was told "port 0..65535; 0 picks a free port", a listener's rule.
    said = error_of(tmp_path, text)
    assert said.startswith(f"{tmp_path / 'pigeon.toml'}, {expected}"), said


_ALL_DIGIT = "is all digits, as only an IP address's is (RFC 1123 2.1); an IPv4 address is four numbers from 0 to 255"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[[route]]\ndomain = "a.example"\nnext_hop = "1.2.3:25"\n',
            "line 3: [[route]] #1 next_hop: '1.2.3:25': '1.2.3' is not a host name: its last label, "
            f'"3", {_ALL_DIGIT}, like 192.0.2.1:25',
        ),
        (
            '[[route]]\ndomain = "a.example"\nnext_hop = "192.0.2.1:25"\n'
            '[[route]]\ndomain = "b.example"\nnext_hop = "999.1.1.1:2525"\n',
            "line 6: [[route]] #2 next_hop: '999.1.1.1:2525': '999.1.1.1' is not a host name: its last label, "
            f'"1", {_ALL_DIGIT}, like 192.0.2.1:2525',
        ),
        (
            '[[route]]\ndomain = "a.example"\nnext_hop = "1.2.3.4.5:25"\n',
            f"line 3: [[route]] #1 next_hop: '1.2.3.4.5:25': '1.2.3.4.5' is not a host name: its last label, \"5\", "
            f"{_ALL_DIGIT}",
        ),
        (
            '[dns]\nnameservers = ["127.1:53"]\n',
            f"line 2: [dns] nameservers: '127.1:53': '127.1' is not a host name: its last label, \"1\", {_ALL_DIGIT}",
        ),
        (
            '[smtp]\nlisten = ["127.1:2525"]\n',
            f"line 2: [smtp] listen: '127.1:2525': '127.1' is not a host name: its last label, \"1\", {_ALL_DIGIT}",
        ),
        (
            '[http]\nlisten = "1.2.3:8025"\n',
            f"line 2: [http] listen: '1.2.3:8025': '1.2.3' is not a host name: its last label, \"3\", {_ALL_DIGIT}",
        ),
        (
            MAILBOX.replace('host = "imap.example.com"', 'host = "10.0.0"') + 'username = "app"\npassword = "pw"\n',
            "line 8: [[mailbox]] #1 host: mailbox 'support': '10.0.0' is not a host name: its last label, \"0\", "
            f"{_ALL_DIGIT}, like 192.0.2.1",
        ),
    ],
    ids=[
        "next-hop-three-numbers",
        "next-hop-octet-over-255",
        "next-hop-five-numbers",
        "nameserver",
        "smtp-listen",
        "http-listen",
        "mailbox-host",
    ],
)
def test_a_host_of_numbers_that_is_no_ipv4_address_is_refused_at_load(tmp_path: Path, text: str, expected: str) -> None:
    # Found from outside: next_hop = "1.2.3:25" passed `pigeon serve --check`; a host name's last
    # label is never all digits, as for [smtp] hostname, and inet_aton reads "1.2.3" as 1.2.0.3.
    said = error_of(tmp_path, text)
    assert said.startswith(f"{tmp_path / 'pigeon.toml'}, {expected}"), said


@pytest.mark.parametrize(
    "hop", ["192.0.2.1:25", "[2001:db8::1]:25", "mx.example.net:25", "mx1.example.net.:25", "1a.example:25"]
)
def test_a_next_hop_that_is_an_ipv4_address_or_a_host_name_loads(tmp_path: Path, hop: str) -> None:
    config = load(write(tmp_path, f'[[route]]\ndomain = "a.example"\nnext_hop = "{hop}"\n'))
    assert config.route[0].next_hop == hop


def test_a_next_hop_and_nameserver_with_a_port_load(tmp_path: Path) -> None:
    text = '[dns]\nnameservers = ["[::1]:53"]\n[[route]]\ndomain = "a.example"\nnext_hop = "[::1]:2525"\n'
    config = load(write(tmp_path, text))
    assert [(e.host, e.port) for e in config.dns.nameservers] == [("::1", 53)]
    assert config.route[0].next_hop is not None and (config.route[0].next_hop.host, config.route[0].next_hop.port) == (
        "::1",
        2525,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[node]\nworkers = "two"\n',
            "line 2: [node] workers: 'two': must be \"auto\" or a number of worker processes",
        ),
        (
            '[node]\nworkers = "3"\n',
            "line 2: [node] workers: '3' is a string: write the number without quotes (workers = 3)",
        ),
        (
            "[smtp]\nlisten = 2525\n",
            'line 2: [smtp] listen: expected a list, e.g. ["127.0.0.1:2525"], or one string, got a whole number 2525',
        ),
        (
            '[[route]]\ndomain = "a.example"\n[[route]]\ndomain = "b.example"\ntls = "always"\n',
            'line 5: [[route]] #2 tls: expected one of "opportunistic", "required", "disabled", "implicit",'
            ' got "always"',
        ),
        (
            '[[reaction]]\nid = "r"\nmatch = "x"\naction = "suspend"\nsite = "ex/ample"\n',
            "line 5: [[reaction]] #1 site: 'ex/ample' holds '/', which no host name holds",
        ),
        (
            '[[queue]]\nname = "a"\n[[queue]]\nname = "b"\npool = "nope"\n',
            "line 5: [[queue]] #2 pool: queue 'b': no [[pool]] called 'nope'",
        ),
        (
            '[[target]]\nname = "a"\nkind = "webhook"\nurl = "http://127.0.0.1:1/"\nformat = "xml"\n',
            'line 5: [[target]] #1 format: expected one of "raw", "json", got "xml"',
        ),
        (
            '[[target]]\nname = "a"\nkind = "sidekiq"\nredis_url = "redis://127.0.0.1:1"\ntimestamps = "minutes"\n',
            'line 5: [[target]] #1 timestamps: expected one of "seconds", "milliseconds", got "minutes"',
        ),
        (
            '[[target]]\nname = "a"\nkind = "webhook"\nurl = "http://127.0.0.1:1/"\nformatt = "raw"\n',
            "line 5: [[target]] #1 formatt: unknown key (did you mean 'format'?)",
        ),
        (
            '[[target]]\nname = "a"\nkind = "webhook"\nurl = "http://127.0.0.1:1/"\ntimestamps = "seconds"\n',
            "line 5: [[target]] #1 timestamps: not a key of this kind (a key of kind 'sidekiq')",
        ),
    ],
    ids=[
        "workers-word",
        "workers-quoted-number",
        "listen-number",
        "route-block",
        "glob-character",
        "queue-block",
        # A target's choices and keys are its kind's (a union of structs): these raised TypeError.
        "target-choice",
        "target-choice-sidekiq",
        "target-unknown-key",
        "target-key-of-another-kind",
    ],
)
def test_config_errors_say_what_to_write_and_name_array_tables_as_the_readme_does(
    tmp_path: Path, text: str, expected: str
) -> None:
    # Found from outside: "Invalid enum value 'two'; choose one of 'auto'", "Expected `array`,
    # got `int`", "[route] tls" where the README writes "[[shaping]] #1 domain", and
    # "'ex/ample' '/' cannot appear in a host name".
    said = error_of(tmp_path, text)
    assert said.startswith(f"{tmp_path / 'pigeon.toml'}, {expected}"), said


def _zeroable_keys() -> list[str]:
    """`[section] key` of every key whose type takes 0: a plain duration, size, data rate or
    count from 0 (the `Positive*` types refuse it at load)."""
    import typing

    from pigeon.config import schema

    keys = []
    for section, kind in typing.get_type_hints(schema.Config).items():
        if typing.get_origin(kind) is list:
            continue  # arrays of tables: their rows are in their own sections' tables
        for key, hint in typing.get_type_hints(kind, include_extras=True).items():
            options = [hint, *typing.get_args(hint)]
            if any(option in (schema.Duration, schema.Size, schema.DataRate) for option in options) or "ge=0" in repr(
                hint
            ):
                keys.append(f"[{section}] {key}")
    return keys


@pytest.mark.parametrize("key", _zeroable_keys())
def test_every_key_that_takes_0_says_in_its_readme_row_what_0_means(key: str) -> None:
    # The README: "must be more than 0 unless its row says what `0` means". [node]
    # shutdown_timeout, [http] max_metadata_size, [spool] inline_limit and segment_from took 0
    # and no row said what it did.
    readme = (Path(__file__).parents[3] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith(f"| `{key}` |"))
    meaning = row.split(" | ", 2)[2]
    assert re.search(r'`"?0(ms|s)?"?`|[Aa]t least `?\d', meaning), f"{key}: its row does not say what 0 means"


def test_a_shutdown_timeout_of_zero_is_refused_naming_the_key(tmp_path: Path) -> None:
    # 0 would cut every open transaction and delivery at once (421 mid-DATA) on any stop.
    message = error_of(tmp_path, "[node]\nshutdown_timeout = 0\n")
    assert message.endswith('line 2: [node] shutdown_timeout: must be more than 0 (e.g. "2s", "250ms")')


@pytest.mark.parametrize("name", ['""', '"a b"', '"a b\\u0007"', '"node\\u0000"', '" node"'])
def test_a_node_name_that_is_empty_or_holds_white_space_or_a_control_character_is_refused(
    tmp_path: Path, name: str
) -> None:
    # It is in every log record and seeds message ids: "a b" loaded, and so did "".
    message = error_of(tmp_path, f"[node]\nname = {name}\n")
    assert "line 2: [node] name: " in message
    assert "not empty, without white space or control characters" in message


@pytest.mark.parametrize("name", ['"a b"', '"x->y"', '""', '"-x"'])
def test_an_implicit_source_name_that_cannot_be_part_of_a_ready_queue_name_is_refused(
    tmp_path: Path, name: str
) -> None:
    message = error_of(tmp_path, f"[delivery]\nsource = {name}\n")
    assert "line 2: [delivery] source: " in message
    assert "letters, digits, '.', '_' and '-' only" in message


def test_node_and_source_names_pigeon_accepts_load(tmp_path: Path) -> None:
    config = load(write(tmp_path, '[node]\nname = "mx-1.example_a"\n[delivery]\nsource = "ip-1.a_b"\n'))
    assert (config.node.name, config.delivery.source) == ("mx-1.example_a", "ip-1.a_b")
    assert load(None).node.name and load(None).delivery.source == "default"  # the defaults load


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[smtp]\nmax_recipients = "x"\n', 'line 2: [smtp] max_recipients: expected a whole number, got a string "x"'),
        ("[smtp]\nmax_recipients = 1.5\n", "line 2: [smtp] max_recipients: expected a whole number, got a number 1.5"),
        ("[smtp]\nmax_recipients = 0\n", "line 2: [smtp] max_recipients: must be a whole number of at least 1, got 0"),
        (
            "[smtp]\nmax_junk_commands = -1\n",
            "line 2: [smtp] max_junk_commands: must be a whole number of at least 0, got -1",
        ),
        ('[smtp]\nstarttls = "yes"\n', 'line 2: [smtp] starttls: expected true or false, got a string "yes"'),
        ("[smtp]\nhostname = 5\n", "line 2: [smtp] hostname: expected a string, got a whole number 5"),
        ("[smtp]\nmax_errors = true\n", "line 2: [smtp] max_errors: expected a whole number, got true"),
        (
            '[[mailbox]]\nname = "m"\nhost = "h"\nusername = "u"\npassword = "p"\ntarget = "t"\nbatch = 2000\n',
            "line 7: [[mailbox]] #1 batch: must be a whole number of at most 1000, got 2000",
        ),
        (
            '[[http.token]]\ntoken = "a0b1c2d3e4f5a6b7c8d9"\nscopes = ["read"]\n',
            "line 1: [[http.token]] #1 name: missing (every [[http.token]] needs one)",
        ),
        (
            '[[route]]\ndomain = "*"\n[[route]]\ntls = "disabled"\n',
            "line 3: [[route]] #2 domain: missing (every [[route]] needs one)",
        ),
        (
            '[[http.token]]\nname = "a"\ntoken = "a0b1c2d3e4f5a6b7c8d9"\nscopes = ["reed"]\n',
            'line 4: [[http.token]] #1 scopes: expected one of "inject", "admin", "read", got "reed"',
        ),
        (
            '[delivery]\nca_file = "/nonexistent/ca.pem"\n',
            "line 2: [delivery] ca_file: CA file /nonexistent/ca.pem does not exist",
        ),
        (
            "[dns]\nnameservers = [1]\n",
            'line 2: [dns] nameservers: 1 is not an address like "192.0.2.1:53" or "[2001:db8::1]:53"',
        ),
        (
            "[delivery]\nmax_message_rate = 100\n",
            'line 2: [delivery] max_message_rate: expected a rate as a string, such as "100/s", "3000/min" or '
            '"100/s,burst=10", got a whole number 100',
        ),
        (
            "[smtp]\nrelay_networks = 10\n",
            'line 2: [smtp] relay_networks: expected a list, e.g. ["10.0.0.0/8", "::1/128"], or one string, '
            "got a whole number 10",
        ),
        (
            "[dns]\nnameservers = 53\n",
            'line 2: [dns] nameservers: expected a list, e.g. ["127.0.0.1:53"], or one string, got a whole number 53',
        ),
    ],
)
def test_config_errors_read_as_pigeons_own_naming_the_block(tmp_path: Path, text: str, expected: str) -> None:
    # Found from outside: msgspec's own "Expected `int`, got `str`", "Object missing required
    # field `name`" under "[http] token", "[delivery] ca_file: [delivery]: CA file", a DNS
    # server's example on port 25, and no word that max_message_rate is a string like "100/s".
    said = error_of(tmp_path, text)
    assert said == f"{tmp_path / 'pigeon.toml'}, {expected}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "[delivery]\nretry_interval = true\n",
            'line 2: [delivery] retry_interval: expected a duration such as "30s", got true',
        ),
        ("[smtp]\nidle_timeout = false\n", 'line 2: [smtp] idle_timeout: expected a duration such as "30s", got false'),
        (
            "[smtp]\nmax_message_size = true\n",
            'line 2: [smtp] max_message_size: expected a size such as "25MiB", got true',
        ),
        ("[spool]\nmax_size = true\n", 'line 2: [spool] max_size: expected a size such as "25MiB", got true'),
        (
            "[smtp]\nmin_data_rate = false\n",
            'line 2: [smtp] min_data_rate: expected a data rate such as "2KiB/s", got false',
        ),
        (
            "[smtp]\nrelay_networks = [true]\n",
            'line 2: [smtp] relay_networks: expected an IP network such as "127.0.0.0/8", got true',
        ),
    ],
)
def test_a_boolean_where_a_duration_size_or_network_goes_is_spelt_as_toml_writes_it(
    tmp_path: Path, text: str, expected: str
) -> None:
    # As an integer key's "got true": not Python's "True is not a duration".
    assert error_of(tmp_path, text) == f"{tmp_path / 'pigeon.toml'}, {expected}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[smtp]\nrelay_networks = "10.0.0.0/8"\n', ["10.0.0.0/8"]),
        ('[dns]\nnameservers = "127.0.0.1:53"\n', ["127.0.0.1:53"]),
    ],
)
def test_a_list_of_addresses_may_be_one_string_as_smtp_listen_may(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    config = load(write(tmp_path, text))
    assert [*config.smtp.relay_networks, *config.dns.nameservers][-1:] == expected


@pytest.mark.parametrize(
    ("rate", "per_second", "burst"),
    [("100/s, burst=10", 100, 10), ("100/s ,burst = 10", 100, 10), ("3000/m", 50, 1), ("86400/d", 1, 1)],
)
def test_a_rate_may_have_white_space_around_its_burst_and_any_unit_the_readme_lists(
    tmp_path: Path, rate: str, per_second: float, burst: int
) -> None:
    from pigeon.shaping.gcra import Rate

    config = load(write(tmp_path, f'[delivery]\nmax_message_rate = "{rate}"\n'))
    assert Rate.parse(config.delivery.max_message_rate or "") == Rate(per_second, burst)
    readme = (Path(__file__).parents[3] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `[delivery] max_message_rate` |"))
    assert '`"3000/m"`' in row and '`"1000/d"`' in row and '", burst=N"' in row


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[node]\nworkers = 1\nuser = "no-such-pigeon-user"\n',
            "line 3: [node] user: no user called 'no-such-pigeon-user' on this system (create one: useradd --system",
        ),
        (
            '[node]\nuser = "root"\ngroup = "no-such-pigeon-group"\n',
            "line 3: [node] group: no group called 'no-such-pigeon-group' on this system",
        ),
        ('[node]\ngroup = "root"\n', "line 2: [node] group: set [node] user as well (group alone changes nothing)"),
    ],
)
def test_a_user_or_group_the_system_does_not_have_is_a_config_error(tmp_path: Path, text: str, expected: str) -> None:
    # It used to pass the load and stop the start later, exit 1, with no file nor line.
    assert error_of(tmp_path, text).startswith(f"{tmp_path / 'pigeon.toml'}, {expected}")


@pytest.mark.parametrize(
    ("rate", "expected"),
    [
        (
            '"ten a second"',
            "queue 'x': 'ten a second' is not a rate: a count per s, m, h or d (or sec, second, min, minute, hour,"
            ' day), like "100/s", "6000/min" or "500/h"',
        ),
        ('"0/s"', "queue 'x': '0/s': the rate must be above zero"),
        ('"5/s,burst=0"', "queue 'x': '5/s,burst=0': burst must be at least 1"),
        (
            "10",
            'expected a rate as a string, such as "100/s", "3000/min" or "100/s,burst=10", got a whole number 10',
        ),
    ],
)
def test_a_queue_rate_that_is_no_rate_is_refused_naming_its_block_and_line(
    tmp_path: Path, rate: str, expected: str
) -> None:
    text = f'[[queue]]\nname = "a:*"\n\n[[queue]]\nname = "x"\nmax_message_rate = {rate}\n'
    assert error_of(tmp_path, text) == f"{tmp_path / 'pigeon.toml'}, line 6: [[queue]] #2 max_message_rate: {expected}"


def test_a_queue_rate_is_the_first_matching_blocks_and_none_for_a_block_without_one(tmp_path: Path) -> None:
    from pigeon.node.outbound import queue_rates
    from pigeon.shaping.gcra import Rate

    text = (
        '[[queue]]\nname = "vip:acme@*"\nretry_interval = "1m"\n\n'
        '[[queue]]\nname = "*:acme@*"\nmax_message_rate = "5/s, burst=3"\n\n'
        '[[queue]]\nname = "*"\nmax_message_rate = "6000/min"\n'
    )
    rates = queue_rates(load(write(tmp_path, text)))
    assert rates.any
    assert rates.of("vip:acme@example.net") is None  # its block sets no rate: not paced
    assert rates.of("news:acme@example.net") == Rate(5.0, 3)
    assert rates.of("example.net") == Rate(100.0, 1)
    assert not queue_rates(load(write(tmp_path, '[[queue]]\nname = "*"\nmax_age = "1d"\n'))).any
