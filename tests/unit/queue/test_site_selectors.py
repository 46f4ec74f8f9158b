"""Which sites a `site` selector names: hosts without a port on any port, a port that port only."""

from __future__ import annotations

import pytest

from pigeon.queue.rules import Selector


@pytest.mark.parametrize(
    ("pattern", "site", "held"),
    [
        ("mx*.example.net", "mx1.example.net,mx2.example.net", True),  # port 25: no port in the site
        ("mx*.example.net", "mx1.example.net,mx2.example.net:2525", True),  # the README's example, any port
        ("mx1.test", "mx1.test:28025", True),
        ("mx*.test", "mx1.test:28025", True),
        ("mx1.test", "mx10.test:28025", False),
        ("mx1.test:28025", "mx1.test:28025", True),
        ("mx1.test:2525", "mx1.test:28025", False),
        ("mx1.test:25", "mx1.test", True),  # a site on port 25 is written without it
        ("mx1.test:25", "mx1.test:2525", False),
        ("127.0.0.1:*", "127.0.0.1:2525", True),
        # One host of a site of several names it: no more connections to that host.
        ("mx2.test*", "mx1.test,mx2.test:28025", True),
        ("mx2.test", "mx1.test,mx2.test", True),
        ("mx2.test:28025", "mx1.test,mx2.test:28025", True),
        ("mx2.test:2525", "mx1.test,mx2.test:28025", False),
        ("mx3.test", "mx1.test,mx2.test", False),
        ("mx1.test,mx3.test", "mx1.test,mx2.test,mx3.test", False),  # a list names that list
    ],
)
def test_a_site_selector_names_hosts_on_any_port_unless_it_names_one(pattern: str, site: str, held: bool) -> None:
    assert Selector(site=pattern).matches_site(site) is held
