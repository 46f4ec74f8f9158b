"""Reaction rules: which replies match, within which scopes, what key the effect is on; the
shipped rules against the providers' real wordings; overriding and turning them off; and
config errors that name the key."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from pigeon.config.load import ConfigError, load
from pigeon.config.schema import ReactionConfig
from pigeon.delivery.reactor import Reactor
from pigeon.shaping.effects import Board
from pigeon.shaping.providers import Providers, shipped
from pigeon.shaping.reactions import Reactions, compile_rule, effective_rules, shipped_provider_of, shipped_rules
from pigeon.smtp.replies import Reply

GMAIL = "alt1.gmail-smtp-in.l.google.com,gmail-smtp-in.l.google.com"
OUTLOOK = "hotmail-com.olc.protection.outlook.com"
OFFICE365 = "example-com.mail.protection.outlook.com"
YAHOO = "mta5.am0.yahoodns.net,mta6.am0.yahoodns.net,mta7.am0.yahoodns.net"
SINK = "127.0.0.1:2526"


def rule(**fields: object) -> ReactionConfig:
    fields.setdefault("id", "r")
    fields.setdefault("action", "suspend")
    fields.setdefault("match", ".")
    return ReactionConfig(**fields)  # type: ignore[arg-type]


def reply(code: int, enhanced: str | None, text: str) -> Reply:
    return Reply(code, enhanced, (text,))


def test_a_rule_matches_the_reply_as_one_line_with_its_codes() -> None:
    reactions = Reactions.from_config([rule(match=r"^421 4\.7\.0 .*rate limited")], defaults=False)
    found = reactions.match(reply(421, "4.7.0", "rate limited, slow down"), SINK, "example.net")
    assert found is not None and found.id == "r"
    assert reactions.match(reply(421, "4.7.1", "rate limited"), SINK, "example.net") is None  # another code
    assert reactions.match(reply(451, "4.7.0", "rate limited"), SINK, "example.net") is None


def test_matching_ignores_case_and_never_looks_at_a_success() -> None:
    reactions = Reactions.from_config([rule(match="rate limited")], defaults=False)
    assert reactions.match(reply(421, "4.7.0", "RATE LIMITED"), SINK, "example.net") is not None
    assert reactions.match(reply(250, "2.0.0", "ok, not rate limited"), SINK, "example.net") is None


def test_scopes_narrow_a_rule_to_a_site_a_domain_or_a_provider() -> None:
    reactions = Reactions.from_config(
        [
            rule(id="by-site", match="busy", site="127.0.0.1:*"),
            rule(id="by-domain", match="busy", domain="*.example.org"),
            rule(id="by-provider", match="busy", provider="gmail"),
        ],
        defaults=False,
    )
    busy = reply(421, "4.3.2", "busy")
    assert (found := reactions.match(busy, SINK, "x.test")) is not None and found.id == "by-site"
    assert (found := reactions.match(busy, "mx.example.org", "a.example.org")) is not None
    assert found.id == "by-domain"
    assert (found := reactions.match(busy, GMAIL, "gmail.com")) is not None and found.id == "by-provider"
    assert reactions.match(busy, "mx.example.com", "example.com") is None


def test_the_first_rule_that_covers_and_matches_wins() -> None:
    rules = [rule(id="first", match="4.7.0", site="nowhere"), rule(id="second", match="4.7.0"), rule(id="third")]
    reactions = Reactions.from_config(rules, defaults=False)
    found = reactions.match(reply(421, "4.7.0", "later"), SINK, "x.test")
    assert found is not None and found.id == "second"


@pytest.mark.parametrize(
    ("scope", "provider", "key"),
    [
        ("site", None, f"site:{GMAIL}"),
        ("source", None, f"path:default->{GMAIL}"),
        ("provider", "gmail", "provider:gmail"),
    ],
)
def test_an_effect_is_on_the_site_the_sources_path_or_the_provider(scope: str, provider: str | None, key: str) -> None:
    compiled = compile_rule(rule(match=".", scope=scope, provider=provider))
    assert compiled.key(f"default->{GMAIL}", GMAIL, shipped_provider_of()(GMAIL)) == key


def test_the_shipped_providers_are_recognised_by_every_mx_host() -> None:
    provider_of = shipped_provider_of()
    assert provider_of(GMAIL) == "gmail"
    assert provider_of(OUTLOOK) == "outlook"
    assert provider_of(OFFICE365) == "office365"
    assert provider_of(YAHOO) == "yahoo"
    assert provider_of("gmail-smtp-in.l.google.com,mx.example.net") is None  # not all of them
    assert provider_of(SINK) is None


@pytest.mark.parametrize(
    ("site", "line", "expected"),
    [
        (GMAIL, (421, "4.7.28", "Our system has detected an unusual rate of unsolicited mail ..."),
         "gmail-rate-limited"),
        (GMAIL, (421, "4.7.0", "Try again later, closing connection. (EHLO) - gsmtp"), "gmail-too-many-connections"),
        (GMAIL, (450, "4.7.0", "... has been temporarily rate limited due to IP reputation"), "gmail-rate-limited"),
        (OUTLOOK, (550, "5.7.1", "Unfortunately, messages from [192.0.2.1] weren't sent ... (S3150)"),
         "microsoft-s3150-blocked"),
        (OFFICE365, (451, "4.7.500", "Server busy. Please try again later from [192.0.2.1]. (S77714)"),
         "microsoft-s775-busy"),
        (YAHOO, (421, "4.7.0", "[TSS04] Messages from 192.0.2.1 temporarily deferred due to unexpected volume"),
         "yahoo-tss04-deferred"),
        (YAHOO, (421, "4.7.0", "[TSS09] All messages from 192.0.2.1 will be permanently deferred"),
         "yahoo-tss09-deferred"),
        # The same words from someone else, or other words from them: nothing.
        (SINK, (421, "4.7.28", "unusual rate"), None),
        (OUTLOOK, (421, "4.7.0", "[TSS04] deferred"), None),
        (GMAIL, (550, "5.1.1", "The email account that you tried to reach does not exist"), None),
    ],
)  # fmt: skip
def test_the_shipped_rules_know_the_providers_wordings(
    site: str, line: tuple[int, str, str], expected: str | None
) -> None:
    found = Reactions.from_config([]).match(reply(*line), site, "example.com")
    assert (found.id if found else None) == expected


def test_shipped_rules_are_replaced_by_id_and_turned_off_one_by_one_or_all_at_once() -> None:
    shipped = [r.id for r in shipped_rules()]
    assert "gmail-rate-limited" in shipped and "yahoo-tss04-deferred" in shipped
    mine = rule(id="gmail-rate-limited", match="x", duration=60)
    off = rule(id="yahoo-tss04-deferred", match="x", enabled=False)
    rules = effective_rules([mine, off])
    ids = [r.id for r in rules]
    assert ids.count("gmail-rate-limited") == 1 and rules[0] is mine
    assert "yahoo-tss04-deferred" not in ids and "yahoo-tss09-deferred" in ids
    assert [r.id for r in effective_rules([mine], defaults=False)] == ["gmail-rate-limited"]


def test_every_shipped_rule_compiles() -> None:
    for config in shipped_rules():
        compiled = compile_rule(config)
        assert compiled.providers  # scoped: no shipped rule reacts to everyone's replies
        assert set(compiled.providers) <= set(Providers(shipped()).names())  # names it knows
        assert 0 < compiled.duration <= 4 * 3600


@pytest.mark.parametrize(
    ("table", "named", "says"),
    [
        ('id = "a"\nmatch = "("\naction = "suspend"', "[[reaction]] #1 match", "not a regular expression"),
        ('id = "a"\nmatch = "x"\naction = "limit"', "[[reaction]] #1 action", "needs connection_limit"),
        ('id = "a"\nmatch = "x"\naction = "limit"\nmax_message_rate = "fast"', "[[reaction]] #1 max_message_rate",
         "not a rate"),
        ('id = "a"\nmatch = "x"\naction = "suspend"\nconnection_limit = 2', "[[reaction]] #1 action", 'for "limit"'),
        ('id = "a"\nmatch = "x"\naction = "suspend"\nscope = "provider"', "[[reaction]] #1 scope", "needs provider"),
        ('id = "a"\nmatch = "x"\naction = "pause"', "action", "pause"),
        ('id = "a"\nmatch = "x"\naction = "suspend"\nthreshold = "5"', "[[reaction]] #1 threshold", "N/DURATION"),
        ('id = "a"\nmatch = "x"\naction = "suspend"\nthreshold = "0/1m"', "[[reaction]] #1 threshold", "N/DURATION"),
        ('id = "a"\nmatch = "x"\naction = "suspend"\nthreshold = "5/soon"', "[[reaction]] #1 threshold", "N/DURATION"),
        ('match = "x"\naction = "suspend"', "id", "missing"),
        ('id = "a"\naction = "suspend"', "[[reaction]] #1 match", "missing"),
        ('id = "a"\nmatch = "x"', "[[reaction]] #1 action", "missing"),
    ],
)  # fmt: skip
def test_a_bad_reaction_is_refused_with_its_key(tmp_path: Path, table: str, named: str, says: str) -> None:
    path = tmp_path / "pigeon.toml"
    path.write_text(f"[[reaction]]\n{table}\n")
    with pytest.raises(ConfigError) as raised:
        load(path)
    assert named in str(raised.value) and says in str(raised.value)


def test_a_shipped_rule_is_turned_off_by_its_id_and_enabled_false_alone(tmp_path: Path) -> None:
    # As the README says: no match or action to copy out of the shipped file.
    path = tmp_path / "pigeon.toml"
    path.write_text('[[reaction]]\nid = "gmail-rate-limited"\nenabled = false\n')
    config = load(path)
    in_force = [r.id for r in effective_rules(config.reaction)]
    assert "gmail-rate-limited" not in in_force and "gmail-too-many-connections" in in_force


def test_two_reactions_may_not_share_an_id(tmp_path: Path) -> None:
    path = tmp_path / "pigeon.toml"
    path.write_text('[[reaction]]\nid = "a"\nmatch = "x"\naction = "suspend"\n' * 2)
    with pytest.raises(ConfigError, match=r"\[\[reaction\]\] #2 id: two \[\[reaction\]\]s are called 'a'"):
        load(path)


def test_a_bad_reaction_is_refused_at_its_own_line_not_the_first_rules(tmp_path: Path) -> None:
    path = tmp_path / "pigeon.toml"
    good = '[[reaction]]\nid = "a"\nmatch = "x"\naction = "suspend"\n\n'
    path.write_text(good + '[[reaction]]\nid = "b"\nmatch = "("\naction = "suspend"\n')
    with pytest.raises(ConfigError, match=r"pigeon.toml, line 8: \[\[reaction\]\] #2 match: b: "):
        load(path)
    path.write_text(good + good)  # the second "a" is the one to rename
    with pytest.raises(ConfigError, match=r"pigeon.toml, line 7: \[\[reaction\]\] #2 id: two"):
        load(path)


def test_a_reaction_for_an_unknown_provider_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pigeon.toml"
    rule = '[[reaction]]\nid = "a"\nmatch = "x"\naction = "suspend"\nprovider = {}\n'
    path.write_text(rule.format('"gmial"'))
    with pytest.raises(
        ConfigError, match=r"line 5: \[\[reaction\]\] #1 provider: a: no provider called 'gmial' \(did you"
    ):
        load(path)
    path.write_text(rule.format('["gmail", "corp"]') + '\n[[provider]]\nname = "corp"\nmx_suffixes = ["corp.test"]\n')
    assert load(path).reaction[0].provider == ["gmail", "corp"]  # a [[provider]] of the file counts
    path.write_text("[delivery]\nprovider_defaults = false\n" + rule.format('"gmail"'))
    with pytest.raises(ConfigError, match=r"no provider called 'gmail'; known: none"):
        load(path)


def test_a_threshold_is_a_count_within_a_duration() -> None:
    assert compile_rule(rule(threshold="5/10m")).threshold == (5, 600.0)
    assert compile_rule(rule(threshold="2/30s")).threshold == (2, 30.0)
    assert compile_rule(rule()).threshold is None


def test_a_rule_with_a_threshold_acts_at_its_nth_match_within_the_window_counted_by_the_nodes_workers(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    reactions = Reactions.from_config([rule(match="rate limited", threshold="3/1m")], defaults=False)
    # Two workers of one node: their boards share the node's effects directory.
    one = Reactor(reactions, Board(tmp_path / "effects", node="n", clock=lambda: now[0]))
    two = Reactor(reactions, Board(tmp_path / "effects", node="n", clock=lambda: now[0]))
    limited = [reply(421, "4.7.0", "rate limited")]
    path = f"default->{SINK}"
    assert one.observe(path, SINK, "example.net", limited) is None  # 1 of 3
    now[0] += 50
    assert two.observe(path, SINK, "example.net", limited) is None  # 2 of 3, on the other worker
    now[0] += 20  # the first is out of the minute now
    assert one.observe(path, SINK, "example.net", limited) is None  # 2 of 3 again
    assert not one.board.live() and not two.board.live()
    now[0] += 5
    effect = two.observe(path, SINK, "example.net", limited)  # 3 within the minute
    assert effect is not None and effect.key == f"site:{SINK}" and effect.action == "suspend"
    # While it lives, matches are repeats and count for nothing; after it, counting starts over.
    assert two.observe(path, SINK, "example.net", limited) == effect
    now[0] += 601
    assert one.observe(path, SINK, "example.net", limited) is None


def test_a_rule_without_a_threshold_acts_at_the_first_match(tmp_path: Path) -> None:
    reactions = Reactions.from_config([rule(match="rate limited")], defaults=False)
    reactor = Reactor(reactions, Board(tmp_path / "effects", node="n"))
    assert reactor.observe(f"default->{SINK}", SINK, "example.net", [reply(421, "4.7.0", "rate limited")])


def test_an_effect_kept_for_an_ipv6_next_hop_before_its_site_was_bracketed_still_applies(tmp_path: Path) -> None:
    # Sites of IPv6 next hops were written "::1:2525", now "[::1]:2525": an effect a node of
    # the old version left in the run directory (or Redis) still holds the site it was for.
    from pigeon.shaping.effects import Effect

    now = 1000.0
    old = Effect(id="e1", rule="r", key="site:::1:2525", action="suspend", created=now, expires_at=now + 600,
                 reply="421 4.7.0 rate limited", node="old")  # fmt: skip
    (tmp_path / "effects").mkdir()
    (tmp_path / "effects" / "suspend.old.json").write_bytes(msgspec.json.encode(old))
    board = Board(tmp_path / "effects", node="new", clock=lambda: now)
    board._scan()
    assert board.find(["site:[::1]:2525"], "suspend") == old
    board._end("e1")
    assert board.find(["site:[::1]:2525"], "suspend") is None


def test_a_reaction_site_glob_names_an_ipv6_next_hop_bracketed_or_as_written_before() -> None:
    reactions = Reactions.from_config([rule(match="rate limited", site="[::1]:2525")], defaults=False)
    before = Reactions.from_config([rule(match="rate limited", site="::1:2525")], defaults=False)
    limited = reply(421, "4.7.0", "rate limited")
    assert reactions.match(limited, "[::1]:2525", "example.net")
    assert before.match(limited, "[::1]:2525", "example.net")
    assert not reactions.match(limited, "[::1]:2526", "example.net")
