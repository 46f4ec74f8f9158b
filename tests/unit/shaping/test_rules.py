"""Which limits a destination is delivered under, which key counts them, and where each came from."""

from __future__ import annotations

from pathlib import Path

from pigeon.config.load import load
from pigeon.shaping.gcra import Rate
from pigeon.shaping.rules import ShapingQuery, ShapingRules

GMAIL_HOSTS = ("aspmx.l.google.com", "alt1.aspmx.l.google.com")
WORKSPACE_HOSTS = ("alt2.aspmx.l.google.com", "alt3.aspmx.l.googlemail.com")


def _rules(tmp_path: Path, text: str) -> ShapingRules:
    path = tmp_path / "pigeon.toml"
    path.write_text(text)
    return ShapingRules.from_config(load(path), path, text)


def test_a_providers_domains_share_one_key_whatever_their_mx_hosts(tmp_path: Path) -> None:
    rules = _rules(tmp_path, "")
    gmail = rules(ShapingQuery("gmail.com", ",".join(GMAIL_HOSTS), GMAIL_HOSTS))
    workspace = rules(ShapingQuery("customer.example", ",".join(WORKSPACE_HOSTS), WORKSPACE_HOSTS))
    assert gmail.key == workspace.key == "provider:gmail"
    assert gmail.provider == workspace.provider == "gmail"
    assert gmail.connection_limit == 5  # the shipped default
    other = rules(ShapingQuery("example.org", "mx.example.org"))
    assert other.key is not None and other.key == "site:mx.example.org"
    assert other.provider is None
    assert other.connection_limit == 32  # [delivery]


def test_each_setting_comes_from_the_first_layer_that_sets_it(tmp_path: Path) -> None:
    text = """\
[delivery]
connection_limit = 20
idle_timeout = "7s"
max_message_rate = "100/s"

[[shaping]]
provider = "gmail"
connection_limit = 3
max_message_rate = "40/s"

[[shaping]]
domain = "*.customer.example"
idle_timeout = "2s"
"""
    rules = _rules(tmp_path, text)
    query = ShapingQuery("eu.customer.example", ",".join(WORKSPACE_HOSTS), WORKSPACE_HOSTS)
    shaping = rules(query)
    assert shaping.connection_limit == 3  # the user's provider block, over the shipped 5
    assert shaping.max_message_rate == Rate.parse("40/s")  # the user's provider block, over [delivery]
    assert shaping.idle_timeout == 2.0  # the user's domain block
    assert shaping.max_deliveries_per_connection == 50  # shipped provider gmail
    assert shaping.key == "provider:gmail"  # the domain block sets no limit of its own
    origins = {s.name: s.origin for s in rules.explain(query).settings}
    assert origins["connection_limit"] == "pigeon.toml [[shaping]] #1 line 8"
    assert origins["idle_timeout"] == "pigeon.toml [[shaping]] #2 line 13"
    assert origins["max_deliveries_per_connection"].startswith("shipped provider gmail (providers.toml line ")
    assert origins["connection_failures_before_delay"] == "[delivery] default"
    # Not a provider's: [delivery] as the file sets it.
    other = rules.explain(ShapingQuery("example.org", "mx.example.org"))
    assert {s.name: s.origin for s in other.settings}["connection_limit"] == "pigeon.toml [delivery] line 2"


def test_a_domain_block_with_limits_of_its_own_is_counted_apart_from_its_provider(tmp_path: Path) -> None:
    rules = _rules(tmp_path, '[[shaping]]\ndomain = "big.example"\nconnection_limit = 2\n')
    shaping = rules(ShapingQuery("big.example", ",".join(GMAIL_HOSTS), GMAIL_HOSTS))
    assert shaping.connection_limit == 2
    assert shaping.key == "domain:big.example"  # its own queue's limits: the domain's alone
    assert shaping.provider == "gmail"


def test_the_shipped_defaults_can_be_turned_off(tmp_path: Path) -> None:
    rules = _rules(tmp_path, "[delivery]\nprovider_defaults = false\n")
    shaping = rules(ShapingQuery("gmail.com", ",".join(GMAIL_HOSTS), GMAIL_HOSTS))
    assert shaping.provider is None
    assert shaping.connection_limit == 32


def test_a_users_provider_replaces_the_shipped_suffixes_and_keeps_its_limits(tmp_path: Path) -> None:
    text = '[[provider]]\nname = "gmail"\nmx_suffixes = ["mx.test"]\n'
    rules = _rules(tmp_path, text)
    mine = rules(ShapingQuery("a.test", "mx1.a.mx.test", ("mx1.a.mx.test",)))
    assert (mine.provider, mine.key, mine.connection_limit) == ("gmail", "provider:gmail", 5)
    google = rules(ShapingQuery("gmail.com", ",".join(GMAIL_HOSTS), GMAIL_HOSTS))
    assert google.provider is None


def test_the_site_is_read_when_no_hosts_are_given(tmp_path: Path) -> None:
    rules = _rules(tmp_path, "")
    shaping = rules(ShapingQuery("gmail.com", ",".join(GMAIL_HOSTS) + ":2525"))
    assert shaping.provider == "gmail"


def test_every_shipped_block_loads_and_names_a_shipped_provider(tmp_path: Path) -> None:
    rules = _rules(tmp_path, "")
    names = rules.providers.names()
    assert {"gmail", "outlook", "office365", "yahoo", "apple", "gmx", "comcast"} <= set(names)
    for name in names:
        provider = rules.providers.get(name)
        assert provider is not None
        host = "mx." + provider.mx_suffixes[0]
        explanation = rules.explain(ShapingQuery("x.example", host, (host,)))
        assert explanation.provider == provider
        assert any(s.origin.startswith(f"shipped provider {name} ") for s in explanation.settings), name


SOURCES = """\
[[source]]
name = "ip-2"
bind = "127.0.0.2"

[[source]]
name = "ip-3"
bind = "127.0.0.3"

[[shaping]]
provider = "gmail"
source = "ip-3"
connection_limit = 1

[[shaping]]
domain = "*.customer.example"
source = "ip-3"
idle_timeout = "3s"

[[shaping]]
provider = "gmail"
connection_limit = 4
max_message_rate = "40/s"

[[shaping]]
domain = "*.customer.example"
idle_timeout = "2s"
max_deliveries_per_connection = 7
"""


def test_a_sources_own_blocks_come_first_and_the_rest_is_every_sources(tmp_path: Path) -> None:
    rules = _rules(tmp_path, SOURCES)
    site = ",".join(WORKSPACE_HOSTS)
    ip3 = ShapingQuery("eu.customer.example", site, WORKSPACE_HOSTS, source="ip-3")
    shaping = rules(ip3)
    assert shaping.connection_limit == 1  # ip-3's provider block, over the provider block for all
    assert shaping.idle_timeout == 3.0  # ip-3's domain block, over the domain block for all
    assert shaping.max_deliveries_per_connection == 7  # the domain block for every source
    assert shaping.max_message_rate == Rate.parse("40/s")  # the provider block for every source
    origins = {s.name: s.origin for s in rules.explain(ip3).settings}
    assert origins["connection_limit"] == "pigeon.toml [[shaping]] #1 line 12"
    assert origins["idle_timeout"] == "pigeon.toml [[shaping]] #2 line 17"
    # Another source, or the implicit one, does not see ip-3's blocks.
    for source in ("ip-2", None):
        other = rules(ShapingQuery("eu.customer.example", site, WORKSPACE_HOSTS, source=source))
        assert (other.connection_limit, other.idle_timeout) == (4, 2.0)


def test_each_source_counts_its_limits_under_keys_of_its_own(tmp_path: Path) -> None:
    rules = _rules(tmp_path, SOURCES)
    site = ",".join(GMAIL_HOSTS)
    assert rules(ShapingQuery("gmail.com", site, GMAIL_HOSTS, source="ip-2")).key == "ip-2->provider:gmail"
    assert rules(ShapingQuery("gmail.com", site, GMAIL_HOSTS, source="ip-3")).key == "ip-3->provider:gmail"
    assert rules(ShapingQuery("gmail.com", site, GMAIL_HOSTS)).key == "provider:gmail"  # implicit: as before
    assert rules(ShapingQuery("example.org", "mx.example.org", source="ip-2")).key == "ip-2->site:mx.example.org"


CATCH_ALL_FIRST = """\
[[shaping]]
domain = "*"
connection_limit = 50
idle_timeout = "9s"

[[shaping]]
domain = "limited.example"
connection_limit = 1
max_message_rate = "10/min"
"""


def test_a_catch_all_ranks_after_a_domain_block_whatever_the_file_order(tmp_path: Path) -> None:
    rules = _rules(tmp_path, CATCH_ALL_FIRST)
    query = ShapingQuery("limited.example", "mx.shared.example")
    shaping = rules(query)
    assert (shaping.connection_limit, shaping.max_message_rate) == (1, Rate.parse("10/min"))  # the domain's rule
    assert shaping.idle_timeout == 9.0  # what the domain's block leaves unset still comes from the catch-all
    origins = {s.name: s.origin for s in rules.explain(query).settings}
    assert origins["connection_limit"] == "pigeon.toml [[shaping]] #2 line 8"
    assert origins["idle_timeout"] == "pigeon.toml [[shaping]] #1 line 4"
    other = rules(ShapingQuery("other.example", "mx.shared.example"))
    assert (other.connection_limit, other.max_message_rate) == (50, None)


def test_a_domain_a_block_names_gets_its_own_queue_and_key_and_the_others_share_the_site(tmp_path: Path) -> None:
    rules = _rules(tmp_path, CATCH_ALL_FIRST)
    assert rules.owns_queue("LIMITED.example") and not rules.owns_queue("other.example")  # "*" opens none
    limited = rules.explain(ShapingQuery("limited.example", "mx.shared.example", security=" (tls required)"))
    assert (limited.own_queue, limited.key) == (True, "domain:limited.example")
    assert limited.queue == "default->limited.example@mx.shared.example (tls required)"
    assert limited.as_dict()["rate_key"] == "domain:limited.example"
    other = rules.explain(ShapingQuery("other.example", "mx.shared.example"))
    assert (other.own_queue, other.key, other.queue) == (False, "site:mx.shared.example", "default->mx.shared.example")
    # The site's shared queue, opened by whichever domain: the catch-all alone shapes it.
    shared = rules(ShapingQuery("limited.example", "mx.shared.example", shared=True))
    assert (shared.connection_limit, shared.max_message_rate, shared.key) == (50, None, "site:mx.shared.example")


def test_with_only_a_catch_all_every_domain_shares_its_sites_queue(tmp_path: Path) -> None:
    rules = _rules(tmp_path, '[[shaping]]\ndomain = "*"\nmax_message_rate = "5/s"\n')
    explanation = rules.explain(ShapingQuery("any.example", "mx.any.example"))
    assert (explanation.own_queue, explanation.key) == (False, "site:mx.any.example")
    assert rules(ShapingQuery("any.example", "mx.any.example", shared=True)).max_message_rate == Rate.parse("5/s")
