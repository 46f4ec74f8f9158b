"""Which provider a site's MX hosts belong to."""

from __future__ import annotations

import pytest

from pigeon.shaping.providers import Provider, Providers, normalise_suffix, shipped, site_hosts

GOOGLE = Provider.make("gmail", ["google.com", "*.googlemail.com"])
YAHOO = Provider.make("yahoo", [".yahoodns.net"])


def test_a_suffix_matches_on_label_boundaries_only() -> None:
    assert GOOGLE.covers("aspmx.l.google.com")
    assert GOOGLE.covers("ALT1.ASPMX.L.GOOGLE.COM.")
    assert GOOGLE.covers("google.com")
    assert GOOGLE.covers("gmail-smtp-in.l.googlemail.com")
    assert not GOOGLE.covers("notgoogle.com")
    assert not GOOGLE.covers("google.com.evil.example")


@pytest.mark.parametrize("written", ["google.com", ".google.com", "*.google.com", "Google.COM."])
def test_the_ways_of_writing_a_suffix_mean_the_same(written: str) -> None:
    assert normalise_suffix(written) == "google.com"


@pytest.mark.parametrize("bad", ["", "*", "*.", "goo gle.com", "google..com", "-x.com"])
def test_what_is_not_a_suffix_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not an MX host suffix"):
        normalise_suffix(bad)


def test_a_site_is_the_providers_only_when_every_host_is() -> None:
    providers = Providers([GOOGLE, YAHOO])
    assert providers.match(["aspmx.l.google.com", "alt1.aspmx.l.google.com"]) is GOOGLE
    assert providers.match(["aspmx.l.google.com", "alt4.gmr-smtp-in.l.googlemail.com"]) is GOOGLE
    # A backup MX of the domain's own: some of its mail goes elsewhere, so it is not Google's.
    assert providers.match(["aspmx.l.google.com", "backup.example.org"]) is None
    assert providers.match(["mta5.am0.yahoodns.net"]) is YAHOO
    assert providers.match([]) is None
    assert Providers([Provider.make("digits", ["0.1"])]).match(["127.0.0.1"]) is None  # an address is no host name


def test_the_first_provider_that_covers_the_hosts_wins_and_names_are_unique() -> None:
    mine = Provider.make("google-eu", ["l.google.com"])
    providers = Providers([mine, GOOGLE, Provider.make("gmail", ["example.net"])])
    assert providers.match(["aspmx.l.google.com"]) is mine
    assert providers.match(["x.googlemail.com"]) is GOOGLE
    assert providers.get("gmail") is GOOGLE  # the first of a name is kept
    assert providers.names() == ["google-eu", "gmail"]


def test_site_hosts_reads_every_form_of_site() -> None:
    assert site_hosts("a.mx.example,b.mx.example") == ("a.mx.example", "b.mx.example")
    assert site_hosts("a.mx.example,b.mx.example:2525") == ("a.mx.example", "b.mx.example")
    assert site_hosts("relay.example:587") == ("relay.example",)
    assert site_hosts("127.0.0.1:2525") == ()
    assert site_hosts("[::1]:25") == ()
    assert site_hosts("inbound:app") == ()
    assert Providers([GOOGLE]).for_site("alt1.aspmx.l.google.com,aspmx.l.google.com:25") is GOOGLE


def test_the_shipped_providers_cover_the_large_ones() -> None:
    providers = Providers(shipped())
    cases = {
        "gmail-smtp-in.l.google.com": "gmail",
        "hotmail-com.olc.protection.outlook.com": "outlook",
        "contoso-com.mail.protection.outlook.com": "office365",
        "mta7.am0.yahoodns.net": "yahoo",
        "mx01.mail.icloud.com": "apple",
        "mx00.emig.gmx.net": "gmx",
        "mx-ha03.web.de": "gmx",
        "mxs.mail.ru": "mailru",
        "mx.yandex.ru": "yandex",
        "mx.zoho.com": "zoho",
        "in1-smtp.messagingengine.com": "fastmail",
        "mx1a1.comcast.net": "comcast",
    }
    for host, name in cases.items():
        found = providers.match([host])
        assert found is not None and found.name == name, host
