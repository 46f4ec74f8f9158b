"""`pigeon shaping check` and `pigeon shaping explain`, as an operator runs them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support import zygote
from tests.support.dns import DnsServer, Zone

GOOD = """\
[delivery]
connection_limit = 20
max_message_rate = "50/s"

[dns]
nameservers = ["{dns}"]
timeout = "1s"

[[provider]]
name = "corp"
mx_suffixes = ["*.mx.corp.test"]

[[shaping]]
domain = "*.customer.test"
idle_timeout = "2s"

[[shaping]]
provider = "gmail"
connection_limit = 3
"""

BAD = """\
[[shaping]]
provider = "gmial"

[[shaping]]
domain = "x.test"
connection_limit = "many"

[[provider]]
name = "corp"
mx_suffixes = ["not a host"]
"""


def pigeon_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return zygote.run([*args], text=True, cwd=cwd, timeout=60)


def test_check_accepts_a_good_file_with_a_summary(tmp_path: Path) -> None:
    (tmp_path / "pigeon.toml").write_text(GOOD.format(dns="127.0.0.1:9"))
    result = pigeon_cli("shaping", "check", "pigeon.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "pigeon.toml: ok",  # (as `pigeon serve --check` says it)
        "  [[provider]] blocks: 1; providers known: 12",
        "  [[shaping]] blocks: 2 (1 by domain, 1 by provider)",
        "  shipped provider defaults: on",
        "  [[reaction]] blocks: 0 (0 new, 0 replacing shipped rules, 0 turning shipped rules off); "
        "rules in force: 7 (7 shipped)",
    ]


def test_check_counts_reaction_blocks_and_the_rules_they_leave_in_force(tmp_path: Path) -> None:
    reactions = (
        '\n[[reaction]]\nid = "gmail-rate-limited"\nenabled = false\n'
        '\n[[reaction]]\nid = "apple-rate-limited"\nmatch = "^421 "\naction = "suspend"\nprovider = "apple"\n'
        '\n[[reaction]]\nid = "corp-busy"\nmatch = "^421 4\\\\.7\\\\.0"\naction = "suspend"\nprovider = "corp"\n'
    )
    (tmp_path / "pigeon.toml").write_text(GOOD.format(dns="127.0.0.1:9") + reactions)
    result = pigeon_cli("shaping", "check", "pigeon.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == (
        "  [[reaction]] blocks: 3 (1 new, 1 replacing shipped rules, 1 turning shipped rules off); "
        "rules in force: 7 (5 shipped)"
    )

    text = GOOD.format(dns="127.0.0.1:9").replace("[dns]", "default_reactions = false\n\n[dns]") + reactions
    (tmp_path / "pigeon.toml").write_text(text)
    result = pigeon_cli("shaping", "check", "pigeon.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == (
        "  [[reaction]] blocks: 3 (2 new, 0 replacing shipped rules, 0 turning shipped rules off, 1 disabled); "
        "rules in force: 2 (shipped reactions off)"
    )


def test_check_lists_every_problem_with_its_key_and_line_and_fails(tmp_path: Path) -> None:
    (tmp_path / "pigeon.toml").write_text(BAD + '\n[smtp]\nlisten_on = "x"\n')
    result = pigeon_cli("shaping", "check", "pigeon.toml", cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 4, result.stdout
    assert lines[0].startswith("pigeon.toml, line 2: [[shaping]] #1 provider: no provider called 'gmial'")
    assert lines[1].startswith(
        'pigeon.toml, line 6: [[shaping]] #2 connection_limit: expected a whole number, got a string "many"'
    )
    assert lines[2].startswith("pigeon.toml, line 10: [[provider]] #1 mx_suffixes: 'not a host' is not")
    assert lines[3].startswith("pigeon.toml, line 13: [smtp] listen_on: unknown key")  # the rest of the file too
    assert "4 problems in pigeon.toml" in result.stderr


def test_check_names_every_wrong_key_of_a_block_not_only_its_first(tmp_path: Path) -> None:
    text = (
        '[[shaping]]\ndomain = "a.test"\nconection_limit = 3\nmax_message_rate = 5\nidle_timeout = "forever"\n\n'
        '[[provider]]\nmx_suffixes = ["mx.corp.test"]\nretries = 2\n'
    )
    (tmp_path / "pigeon.toml").write_text(text)
    result = pigeon_cli("shaping", "check", "pigeon.toml", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(":", 2)[1].strip() for line in lines] == [
        "[[shaping]] #1 conection_limit",
        "[[shaping]] #1 max_message_rate",
        "[[shaping]] #1 idle_timeout",
        "[[provider]] #1 name",  # missing: named at the block's first line
        "[[provider]] #1 retries",
    ], result.stdout
    assert "did you mean 'connection_limit'?" in lines[0]
    assert lines[3] == "pigeon.toml, line 7: [[provider]] #1 name: missing (every such block needs one)"
    assert "5 problems in pigeon.toml" in result.stderr


def test_check_a_block_with_a_wrong_key_still_gets_its_other_keys_checked(tmp_path: Path) -> None:
    # A misspelt key used to skip the checks across keys for its whole block: the unknown
    # provider, the bad rate and the bad suffix only showed once the key was fixed.
    text = (
        '[[shaping]]\nprovider = "gmial"\nconection_limit = 5\nmax_message_rate = "5/fortnight"\n\n'
        "[[shaping]]\nretries = 2\n\n"
        '[[provider]]\nmx_suffixes = ["not a host"]\n'
    )
    (tmp_path / "pigeon.toml").write_text(text)
    result = pigeon_cli("shaping", "check", "pigeon.toml", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert [line.split(":", 2)[1].strip() for line in result.stdout.splitlines()] == [
        "[[shaping]] #1 provider",
        "[[shaping]] #1 conection_limit",
        "[[shaping]] #1 max_message_rate",
        "[[shaping]] #2 domain",  # neither domain nor provider
        "[[shaping]] #2 retries",
        "[[provider]] #1 name",
        "[[provider]] #1 mx_suffixes",
    ], result.stdout
    assert "no provider called 'gmial' (did you mean 'gmail'?)" in result.stdout
    assert "'not a host' is not an MX host suffix" in result.stdout
    assert "7 problems in pigeon.toml" in result.stderr


def test_check_reports_a_shaping_block_for_an_unknown_source_as_a_problem(tmp_path: Path) -> None:
    # Each block and the rest of the file are right on their own: only the two together are not.
    text = '[[source]]\nname = "ip-2"\nbind = "127.0.0.1"\n\n[[shaping]]\nprovider = "gmail"\nsource = "ip-9"\n'
    (tmp_path / "pigeon.toml").write_text(text)
    result = pigeon_cli("shaping", "check", "pigeon.toml", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "pigeon.toml, line 7: [[shaping]] #1 source: no [[source]] called 'ip-9' (known: 'ip-2')"
    ]
    assert "1 problem in pigeon.toml" in result.stderr


def _zone() -> Zone:
    return Zone(
        {
            "eu.customer.test": [("MX", 10, "aspmx.l.google.com"), ("MX", 20, "alt1.aspmx.l.google.com")],
            "plain.test": [("MX", 10, "mx.plain.test")],
        }
    )


def test_explain_prints_the_site_provider_and_where_each_setting_came_from(tmp_path: Path) -> None:
    with DnsServer(_zone()) as dns:
        (tmp_path / "pigeon.toml").write_text(GOOD.format(dns=dns.endpoint))
        result = pigeon_cli("shaping", "explain", "EU.customer.test", "-c", "pigeon.toml", cwd=tmp_path)
        other = pigeon_cli("shaping", "explain", "plain.test", "-c", "pigeon.toml", cwd=tmp_path)
        missing = pigeon_cli("shaping", "explain", "nowhere.test", "-c", "pigeon.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:6] == [
        "domain    eu.customer.test",
        "site      alt1.aspmx.l.google.com,aspmx.l.google.com",
        "MX hosts  aspmx.l.google.com alt1.aspmx.l.google.com",
        "provider  gmail (MX suffixes: google.com, googlemail.com)",
        "rate key  provider:gmail (shared by every domain of the provider)",
        "queue     default->eu.customer.test@alt1.aspmx.l.google.com,aspmx.l.google.com"
        " (its own: a [[shaping]] block names this domain)",
    ]
    settings = {line.split()[0]: line.split(None, 2)[1:] for line in lines[8:]}
    assert settings["connection_limit"] == ["3", "pigeon.toml [[shaping]] #2 line 19"]
    assert settings["idle_timeout"] == ["2s", "pigeon.toml [[shaping]] #1 line 15"]
    assert settings["max_deliveries_per_connection"][0] == "50"
    assert settings["max_deliveries_per_connection"][1].startswith("shipped provider gmail (providers.toml line ")
    assert settings["max_message_rate"] == ["50/s", "pigeon.toml [delivery] line 3"]
    assert settings["connection_failures_before_delay"] == ["3", "[delivery] default"]
    assert other.returncode == 0, other.stderr
    heading, first = other.stdout.splitlines()[7:9]  # values narrower than "value" still line up under it
    assert heading.index("from") == first.index("pigeon.toml"), other.stdout
    assert "provider  none" in other.stdout and "rate key  site:mx.plain.test (this site's own)" in other.stdout
    assert "queue     default->mx.plain.test (shared by the site's domains that no [[shaping]] block names)" in (
        other.stdout
    )
    assert ["connection_limit", "20", "pigeon.toml [delivery] line 2"] in [
        line.split(None, 2) for line in other.stdout.splitlines()
    ]
    assert missing.returncode == 1
    assert missing.stderr == "pigeon: nowhere.test: domain nowhere.test does not exist (NXDOMAIN) (550 5.1.2)\n"


def test_explain_json_gives_each_setting_its_value_and_origin(tmp_path: Path) -> None:
    with DnsServer(_zone()) as dns:
        (tmp_path / "pigeon.toml").write_text(GOOD.format(dns=dns.endpoint))
        result = pigeon_cli("shaping", "explain", "eu.customer.test", "-c", "pigeon.toml", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["provider"] == "gmail" and answer["key"] == "provider:gmail"
    assert answer["site"] == "alt1.aspmx.l.google.com,aspmx.l.google.com"
    assert answer["queue"] == "default->eu.customer.test@alt1.aspmx.l.google.com,aspmx.l.google.com"
    assert answer["own_queue"] is True and answer["rate_key"] == "provider:gmail"
    assert answer["settings"]["connection_limit"] == {"value": 3, "from": "pigeon.toml [[shaping]] #2 line 19"}
    assert answer["settings"]["idle_timeout"] == {"value": 2.0, "from": "pigeon.toml [[shaping]] #1 line 15"}
    assert answer["settings"]["max_message_rate"] == {"value": "50/s", "from": "pigeon.toml [delivery] line 3"}


def test_explain_from_a_source_shows_its_own_blocks_and_key(tmp_path: Path) -> None:
    source = '\n[[source]]\nname = "ip-3"\nbind = "127.0.0.3"\n'
    own = '\n[[shaping]]\nprovider = "gmail"\nsource = "ip-3"\nconnection_limit = 1\n'
    explain = ("shaping", "explain", "eu.customer.test", "-c", "pigeon.toml", "--source")
    with DnsServer(_zone()) as dns:
        (tmp_path / "pigeon.toml").write_text(GOOD.format(dns=dns.endpoint) + source + own)
        result = pigeon_cli(*explain, "ip-3", cwd=tmp_path)
        as_json = pigeon_cli(*explain, "ip-3", "--json", cwd=tmp_path)
        unknown = pigeon_cli(*explain, "ip-9", cwd=tmp_path)
        implicit = pigeon_cli(*explain[:-1], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # Without --source, it says whose limits these are, and which sources there are to ask about.
    assert implicit.stdout.splitlines()[-1] == "(as sent from the implicit source; --source NAME shows one of: ip-3)"
    assert "implicit source" not in result.stdout
    lines = result.stdout.splitlines()
    assert lines[3:6] == [
        "source    ip-3",
        "provider  gmail (MX suffixes: google.com, googlemail.com)",
        "rate key  ip-3->provider:gmail (shared by every domain of the provider, from this source)",
    ]
    settings = {line.split()[0]: line.split(None, 2)[1:] for line in lines[8:]}
    assert settings["connection_limit"] == ["1", "pigeon.toml [[shaping]] #3 line 28"]
    assert settings["idle_timeout"] == ["2s", "pigeon.toml [[shaping]] #1 line 15"]  # for every source
    assert unknown.returncode == 2 and "no [[source]] called 'ip-9' (known: ip-3)" in unknown.stderr  # usage
    answer = json.loads(as_json.stdout)
    assert (answer["source"], answer["key"]) == ("ip-3", "ip-3->provider:gmail")


def test_explain_with_a_queue_shows_its_own_rate_and_the_queue_block_it_came_from(tmp_path: Path) -> None:
    queues = '\n[[queue]]\nname = "vip:*"\ndsn = false\n\n[[queue]]\nname = "*:acme@*"\nmax_message_rate = "10/s"\n'
    explain = ("shaping", "explain", "eu.customer.test", "-c", "pigeon.toml", "--queue")
    with DnsServer(_zone()) as dns:
        (tmp_path / "pigeon.toml").write_text(GOOD.format(dns=dns.endpoint) + queues)
        line = len((tmp_path / "pigeon.toml").read_text().splitlines())
        paced = pigeon_cli(*explain, "news:acme@eu.customer.test", cwd=tmp_path)
        unpaced = pigeon_cli(*explain, "vip:acme@eu.customer.test", "--json", cwd=tmp_path)
    assert paced.returncode == 0, paced.stderr
    assert (
        "scheduled queue news:acme@eu.customer.test: max_message_rate 10/s  "
        f"pigeon.toml [[queue]] #2 line {line} (name '*:acme@*')"
    ) in paced.stdout.splitlines()
    answer = json.loads(unpaced.stdout)
    assert answer["scheduled_queue"] == {
        "name": "vip:acme@eu.customer.test",
        "max_message_rate": None,  # the first matching block is its, and sets none
        "from": f"pigeon.toml [[queue]] #1 line {line - 6} (name 'vip:*')",
    }


def test_explain_piped_into_a_reader_that_stops_early_ends_quietly(tmp_path: Path) -> None:
    """`pigeon shaping explain D | head -1`: no BrokenPipeError traceback, exit status 0."""
    config = tmp_path / "pigeon.toml"
    config.write_text(
        '[dns]\nnameservers = ["127.0.0.1:9"]\ntimeout = "1s"\n[[route]]\ndomain = "*"\nnext_hop = "127.0.0.1:2526"\n'
    )
    reader = subprocess.Popen(["head", "-c", "10"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert reader.stdin is not None
    explain = subprocess.run(
        [sys.executable, "-m", "pigeon", "shaping", "explain", "-c", str(config), "example.com"],
        stdout=reader.stdin, stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    reader.stdin.close()
    reader.wait(10)
    assert "Traceback" not in explain.stderr and "BrokenPipeError" not in explain.stderr, explain.stderr
    assert explain.returncode == 0


def test_each_shaping_action_s_help_shows_its_own_examples(tmp_path: Path) -> None:
    end = pigeon_cli("shaping", "end", "--help", cwd=tmp_path).stdout
    assert "pigeon shaping end 3f9a0c1b2d4e" in end and "pigeon shaping explain" not in end
    group = pigeon_cli("shaping", "--help", cwd=tmp_path).stdout
    assert all(f"pigeon shaping {action}" in group for action in ("check", "explain", "status", "end"))


def test_explain_writes_an_ipv6_next_hop_s_site_and_queue_with_brackets(tmp_path: Path) -> None:
    # Found from outside: a route to "[::1]:44127" gave site and queue "default->::1:44127",
    # where the port cannot be told from the address, while errors wrote "[::1]:44127".
    text = '[dns]\nnameservers = ["127.0.0.1:9"]\n\n[[route]]\ndomain = "v6.example"\nnext_hop = "[::1]:44127"\n'
    (tmp_path / "pigeon.toml").write_text(text)
    result = pigeon_cli("shaping", "explain", "v6.example", "-c", "pigeon.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == "site      [::1]:44127"
    assert lines[2] == "next hop  [::1]:44127"  # as the route gives it: in brackets, with its port
    assert lines[4] == "rate key  site:[::1]:44127 (this site's own)"
    assert lines[5].startswith("queue     default->[::1]:44127 ")


def test_explain_says_a_queue_apart_for_a_tls_policy_is_shared_only_by_domains_with_that_policy(
    tmp_path: Path,
) -> None:
    # Found from outside: a domain whose [[route]] set only tls = "required" was told its queue
    # "(tls required)" was "shared by the site's domains that no [[shaping]] block names",
    # while the site's other domains (sent opportunistically) have another.
    with DnsServer(_zone()) as dns:
        config = f'[dns]\nnameservers = ["{dns.endpoint}"]\n\n[[route]]\ndomain = "plain.test"\ntls = "required"\n'
        (tmp_path / "pigeon.toml").write_text(config)
        result = pigeon_cli("shaping", "explain", "plain.test", "-c", "pigeon.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[5] == (
        "queue     default->mx.plain.test (tls required) (shared by the site's domains sent with the same TLS policy"
        " that no [[shaping]] block names)"
    )


def test_explain_calls_a_route_s_next_hop_a_next_hop_and_mx_hosts_only_what_mx_records_gave(tmp_path: Path) -> None:
    # Found from outside: a [[route]] to a smart host printed it as "MX hosts", though no MX
    # lookup was made and the host is no domain's MX.
    with DnsServer(_zone()) as dns:
        config = f'[dns]\nnameservers = ["{dns.endpoint}"]\n\n[[route]]\ndomain = "relayed.test"\n'
        config += 'next_hop = "smarthost.relay.test:2525"\n\n[[route]]\ndomain = "plain.test"\ntls = "required"\n'
        (tmp_path / "pigeon.toml").write_text(config)
        relayed = pigeon_cli("shaping", "explain", "relayed.test", "-c", "pigeon.toml", cwd=tmp_path)
        as_json = pigeon_cli("shaping", "explain", "relayed.test", "-c", "pigeon.toml", "--json", cwd=tmp_path)
        literal = pigeon_cli("shaping", "explain", "[127.0.0.1]", "-c", "pigeon.toml", cwd=tmp_path)
        looked_up = pigeon_cli("shaping", "explain", "plain.test", "-c", "pigeon.toml", cwd=tmp_path)
        looked_up_json = pigeon_cli("shaping", "explain", "plain.test", "-c", "pigeon.toml", "--json", cwd=tmp_path)
    assert relayed.returncode == 0, relayed.stderr
    assert relayed.stdout.splitlines()[1:4] == [
        "site      smarthost.relay.test:2525",
        # Found from outside: the port was left out ("next hop  smarthost.relay.test"), though
        # the site and the route have it.
        "next hop  smarthost.relay.test:2525",
        "provider  none (no provider's MX suffixes cover the [[route]]'s next hop)",
    ]
    assert "MX host" not in relayed.stdout
    answer = json.loads(as_json.stdout)
    assert (answer["hosts_from"], answer["next_hop"]) == ("route", "smarthost.relay.test:2525")
    assert answer["hosts"] == ["smarthost.relay.test"]  # (what a provider's MX suffixes are matched against)
    assert literal.returncode == 0, literal.stderr
    assert literal.stdout.splitlines()[2] == "host      127.0.0.1"
    assert json.loads(looked_up_json.stdout)["next_hop"] is None
    # A [[route]] that sets only a TLS policy still looks up the MX records: those are MX hosts.
    assert looked_up.stdout.splitlines()[2:4] == [
        "MX hosts  mx.plain.test",
        "provider  none (no provider's MX suffixes cover every MX host)",
    ]


def test_explain_asks_the_second_nameserver_when_the_first_never_answers(tmp_path: Path) -> None:
    # Found from outside: with a first [dns] nameserver that never answers, every lookup failed
    # "451 4.4.3 DNS lookup of MX ... failed: LifetimeTimeout" and the second was never asked.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent, DnsServer(_zone()) as dns:
        silent.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{silent.getsockname()[1]}"
        config = f'[dns]\nnameservers = ["{dead}", "{dns.endpoint}"]\ntimeout = "2s"\n'
        (tmp_path / "pigeon.toml").write_text(config)
        result = pigeon_cli("shaping", "explain", "plain.test", "-c", "pigeon.toml", cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.splitlines()[1] == "site      mx.plain.test"
        assert ("plain.test", "MX") in dns.zone.queries


def test_explain_says_the_mta_sts_policy_the_node_cached_and_which_mx_hosts_it_allows(tmp_path: Path) -> None:
    # `explain` showed a domain under an enforced policy as routed to all its MX hosts, in the
    # queue of mail without one: the node sends it only to the hosts the policy allows, over TLS
    # verified, in a queue of its own. It reads the node's cached policies (no lookup, no fetch).
    zone = Zone(
        {
            "sts.test": [("MX", 10, "mx1.sts.test"), ("MX", 20, "backup.elsewhere.test")],
            "plain.test": [("MX", 10, "mx.plain.test")],
        }
    )
    spool = tmp_path / "spool"
    spool.mkdir()
    fetched = time.time() - 3600
    policy = "version: STSv1\nmode: enforce\nmx: *.sts.test\nmax_age: 86400\n"
    cached = {"version": 1, "policies": {"sts.test": {"id": "20240101", "fetched": fetched, "policy": policy}}}
    (spool / "mta-sts-1.json").write_text(json.dumps(cached))  # (worker 1's: every worker's file is read)
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(fetched + 86400))
    with DnsServer(zone) as dns:
        (tmp_path / "pigeon.toml").write_text(GOOD.format(dns=dns.endpoint) + '\n[spool]\npath = "spool"\n')
        result = pigeon_cli("shaping", "explain", "sts.test", "-c", "pigeon.toml", cwd=tmp_path)
        as_json = pigeon_cli("shaping", "explain", "sts.test", "-c", "pigeon.toml", "--json", cwd=tmp_path)
        plain = pigeon_cli("shaping", "explain", "plain.test", "-c", "pigeon.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1:4] == [
        "site      mx1.sts.test",
        "MX hosts  mx1.sts.test",
        f"mta-sts   mode enforce (id 20240101, cached until {until}, mx *.sts.test): allows mx1.sts.test; "
        "refuses backup.elsewhere.test; only over TLS verified for the host's name",
    ]
    assert "queue     default->mx1.sts.test (tls required, verified, MTA-STS enforce) (" in result.stdout
    answer = json.loads(as_json.stdout)
    assert answer["mta_sts"] == {
        "mode": "enforce",
        "id": "20240101",
        "mx": ["*.sts.test"],
        "until": until,
        "allowed_hosts": ["mx1.sts.test"],
        "refused_hosts": ["backup.elsewhere.test"],
    }
    assert plain.returncode == 0, plain.stderr
    assert "mta-sts" not in plain.stdout  # (none cached: no line)
    assert not [q for q in dns.zone.queries if q[0].startswith("_mta-sts.")]  # nothing looked up


def test_explain_and_config_show_say_whose_mail_a_reserved_route_is_for(tmp_path: Path) -> None:
    config = '[[route]]\ndomain = "*.globex.test"\nnext_hop = "relay.test:2525"\ntenants = ["globex"]\n'
    config += '\n[[route]]\ndomain = "*"\nnext_hop = "mx.test:25"\n'
    (tmp_path / "pigeon.toml").write_text(config)
    reserved = pigeon_cli("shaping", "explain", "a.globex.test", "-c", "pigeon.toml", cwd=tmp_path)
    as_json = pigeon_cli("shaping", "explain", "a.globex.test", "-c", "pigeon.toml", "--json", cwd=tmp_path)
    anyone = pigeon_cli("shaping", "explain", "example.net", "-c", "pigeon.toml", "--json", cwd=tmp_path)
    shown = pigeon_cli("config", "show", "-c", "pigeon.toml", "--changed", cwd=tmp_path)
    assert reserved.returncode == 0, reserved.stderr
    assert reserved.stdout.splitlines()[3] == (
        "tenants   globex ([[route]] tenants: any other tenant's mail, or none's, is refused)"
    )
    assert json.loads(as_json.stdout)["route_tenants"] == ["globex"]
    assert json.loads(anyone.stdout)["route_tenants"] is None
    assert 'tenants = ["globex"]' in shown.stdout, shown.stdout
