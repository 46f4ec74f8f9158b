"""The inbound pieces that need no server: identities, routes, UID sets, job formats, signatures."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time
import urllib.parse
from email.parser import Parser
from email.policy import compat32
from email.utils import getaddresses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pigeon.config.schema import SidekiqTarget as SidekiqConfig
from pigeon.inbound.headers import broken_b_word, decode_value, header_fields
from pigeon.inbound.imap import uid_set
from pigeon.inbound.mailbox import retry_delay
from pigeon.inbound.message import InboundMessage, dedupe_key, message_id
from pigeon.inbound.routes import InboundRoute, InboundRoutes
from pigeon.inbound.targets.base import Handoff, Verdict, not_before
from pigeon.inbound.targets.sidekiq import SidekiqTarget
from pigeon.inbound.targets.webhook import json_body, retry_after, signature, signed_string

RAW = b"From: a@example.com\r\nMessage-ID:\r\n <x1@example.com>\r\nSubject: hi\r\n\r\nbody\r\n"


def test_dedupe_key_is_the_sha256_of_the_raw_bytes() -> None:
    assert dedupe_key(RAW) == hashlib.sha256(RAW).hexdigest()
    assert dedupe_key(RAW) != dedupe_key(RAW + b"x")


def test_message_id_is_unfolded_and_absent_when_missing() -> None:
    assert message_id(RAW) == "<x1@example.com>"
    assert message_id(b"Subject: x\r\n\r\nMessage-ID: <in-body@x>\r\n") is None


@given(st.lists(st.integers(min_value=1, max_value=500), max_size=60))
def test_uid_set_names_exactly_the_uids(uids: list[int]) -> None:
    text = uid_set(uids)
    named: set[int] = set()
    for part in filter(None, text.split(",")):
        low, _, high = part.partition(":")
        named.update(range(int(low), int(high or low) + 1))
    assert named == set(uids)


def test_uid_set_compresses_runs() -> None:
    assert uid_set([3, 1, 2, 7, 9, 10]) == "1:3,7,9:10"


def test_inbound_routes_match_address_globs_then_domains_in_order() -> None:
    routes = InboundRoutes(
        [
            InboundRoute("billing", recipient="Billing@App.example"),
            InboundRoute("replies", recipient="reply+*@app.example"),
            InboundRoute("helpdesk", domain="*.app.example"),
            InboundRoute("catchall", domain="app.example"),
        ]
    )
    assert routes.routing_key("billing@app.example") == "inbound:billing"
    assert routes.routing_key('"billing"@app.example') == "inbound:billing"  # the same mailbox (RFC 5321 4.1.2)
    assert routes.routing_key('"reply+42"@app.example') == "inbound:replies"
    # A quoted local part that is no dot-string is matched by its value (the quotes are syntax).
    assert routes.routing_key('"reply+q z"@app.example') == "inbound:replies"
    assert routes.routing_key('"Reply+q\\ z"@app.example') == "inbound:replies"
    assert routes.routing_key('"billing "@app.example') == "inbound:catchall"
    assert routes.routing_key("reply+42@APP.example") == "inbound:replies"
    assert routes.routing_key("anyone@eu.app.example") == "inbound:helpdesk"
    assert routes.routing_key("support@app.example") == "inbound:catchall"
    assert routes.routing_key("someone@elsewhere.example") is None
    assert routes.target("anyone@eu.app.example") == "helpdesk"
    assert routes.target("someone@elsewhere.example") is None


def test_an_inbound_recipient_glob_written_quoted_matches_the_values_it_names() -> None:
    routes = InboundRoutes([InboundRoute("replies", recipient='"Reply+*"@app.example')])
    assert routes.target("reply+1@app.example") == "replies"
    assert routes.target('"reply+q z"@app.example') == "replies"
    assert routes.target("other@app.example") is None


def test_retry_delay_doubles_up_to_the_cap() -> None:
    assert 4.0 <= retry_delay(1, 5, 300) <= 5
    assert 16.0 <= retry_delay(3, 5, 300) <= 20
    assert 240.0 <= retry_delay(30, 5, 300) <= 300


def _sidekiq(**options: object) -> SidekiqTarget:
    config = SidekiqConfig(name="jobs", queue="mail", job_class="InboundJob", **options)  # type: ignore[arg-type]
    return SidekiqTarget(config, "redis://127.0.0.1:1/0")


def test_sidekiq_job_has_what_sidekiq_s_own_client_writes() -> None:
    message = InboundMessage.of(RAW, "imap:support", 1700000000.5, mailbox="app@h:993/INBOX", uidvalidity=7, uid=3)
    job = json.loads(_sidekiq().job(message, 1700000001.25))
    assert job["class"] == "InboundJob"
    assert job["queue"] == "mail"
    assert job["retry"] is True
    assert re.fullmatch("[0-9a-f]{24}", job["jid"])
    assert job["created_at"] == job["enqueued_at"] == 1700000001.25
    raw, meta = job["args"]
    assert raw.encode() == RAW
    assert meta["dedupe_key"] == dedupe_key(RAW)
    assert meta["message_id"] == "<x1@example.com>"
    assert (meta["mailbox"], meta["uidvalidity"], meta["uid"]) == ("app@h:993/INBOX", 7, 3)


def test_sidekiq_8_timestamps_are_integer_milliseconds_and_binary_mail_is_base64() -> None:
    binary = b"Subject: x\r\n\r\n\xff\xfe\r\n"
    job = json.loads(_sidekiq(timestamps="milliseconds").job(InboundMessage.of(binary, "smtp", 1.0), 1700000001.25))
    assert job["enqueued_at"] == 1700000001250
    assert job["args"][1]["raw_encoding"] == "base64"


def test_webhook_signature_is_hmac_sha256_over_timestamp_and_body() -> None:
    value = signature("s3cret", 1700000000, b"body")
    expected = hmac.new(b"s3cret", b"1700000000.body", hashlib.sha256).hexdigest()
    assert value == f"t=1700000000,v1={expected}"


def test_webhook_signature_v2_is_hmac_sha256_over_timestamp_signed_headers_and_body() -> None:
    headers = {"Content-Type": "message/rfc822", "X-Pigeon-Recipients": "a@x.example", "X-Pigeon-Dedupe-Key": "k"}
    value = signature("s3cret", 1700000000, b"body", headers)
    signed = b"1700000000\nx-pigeon-dedupe-key:k\nx-pigeon-recipients:a@x.example\n\nbody"
    assert signed_string(1700000000, headers, b"body") == signed  # in SIGNED_HEADERS' order, others left out
    v1 = hmac.new(b"s3cret", b"1700000000.body", hashlib.sha256).hexdigest()
    assert value == f"t=1700000000,v1={v1},v2={hmac.new(b's3cret', signed, hashlib.sha256).hexdigest()}"


def test_no_two_header_sets_give_the_same_v2_string() -> None:
    """An absent header is not an empty one, nor one moved into the body or out of it."""
    key = {"X-Pigeon-Dedupe-Key": "k"}
    variants = [
        signed_string(1, key, b"x-pigeon-sender:\n\nbody"),
        signed_string(1, {**key, "X-Pigeon-Sender": ""}, b"body"),
        signed_string(1, {**key, "X-Pigeon-Sender": ""}, b"\nbody"),
        signed_string(1, {**key, "X-Pigeon-Recipients": ""}, b"body"),
        signed_string(1, {**key, "X-Pigeon-Recipients-Count": "0"}, b"body"),
        signed_string(1, key, b"body"),
        signed_string(1, {}, b"x-pigeon-dedupe-key:k\n\nbody"),
        signed_string(11, key, b"body"),
    ]
    assert len(set(variants)) == len(variants)


def test_webhook_json_carries_headers_and_the_raw_message() -> None:
    body = json.loads(json_body(InboundMessage.of(RAW, "smtp", 1.0)))
    assert ["Subject", "hi"] in body["headers"]
    assert body["raw"].encode() == RAW
    assert body["dedupe_key"] == dedupe_key(RAW)


@pytest.mark.parametrize("text", ["", "Subject: only headers"])
def test_message_id_of_odd_messages_is_none(text: str) -> None:
    assert message_id(text.encode()) is None


def test_control_characters_are_dropped_from_the_message_id() -> None:
    assert message_id(b"Message-ID: <a\rb\x00c@x>\r\n\r\n") == "<abc@x>"


_FIELD_LINES = st.one_of(
    st.tuples(
        st.sampled_from(["Subject", "X-Odd.Name!", "to", "From", "Received", "A"]),
        st.sampled_from([":", ": ", ":\t", ":  \t "]),
        st.text(st.sampled_from('ab: \t("=?é€\u2028\x85\x01\x00'), max_size=12),
    ).map("".join),
    st.text(st.sampled_from(" \t"), min_size=1, max_size=2).flatmap(
        lambda lead: st.text(st.sampled_from("xy: \t"), max_size=8).map(lambda rest: lead + rest)
    ),
    st.sampled_from(["From someone@example.com Mon Jan 1", "no colon here", ":empty name", "Bad Name: x", ""]),
)


@given(st.lists(_FIELD_LINES, max_size=8), st.sampled_from(["\r\n", "\n", "\r"]))
def test_header_fields_read_directly_are_what_the_email_package_reads(lines: list[str], end: str) -> None:
    block = end.join(lines).encode("utf-8")
    parsed = Parser(policy=compat32).parsestr(block.decode("utf-8") + "\r\n\r\n", headersonly=True)
    assert header_fields(block) == [[name, str(value)] for name, value in parsed.items()]


def test_a_raw_webhook_s_envelope_headers_stay_short_enough_for_any_server() -> None:
    from pigeon.inbound.targets.webhook import _envelope_headers

    recipients = [f"reply+{n:04}-{'x' * 30}@app.example" for n in range(250)]
    headers = _envelope_headers("ann@example.com", recipients)
    assert len(headers["X-Pigeon-Recipients"]) <= 4000  # a line over 8 KiB gets a 400: a refusal for good
    assert headers["X-Pigeon-Recipients"].startswith("reply+0000-")
    assert headers["X-Pigeon-Recipients-Count"] == "250"
    assert _envelope_headers("", ["b,c@x.example", "ü@x.example"])["X-Pigeon-Recipients"] == (
        "b%2Cc@x.example, %C3%BC@x.example"
    )


def test_envelope_headers_encode_what_the_readme_says_and_decode_to_the_addresses() -> None:
    """The README says which characters an address keeps in X-Pigeon-Recipients (it said "non-ASCII
    percent-encoded", while a quoted local part's `"` is encoded too), and how to read the list."""
    from pigeon.inbound.targets.webhook import HEADER_SAFE, _envelope_headers

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    said = re.search(r"percent-encoded as UTF-8 but for ASCII letters, digits and\s+``(.+?)``", readme)
    assert said is not None and said.group(1) == HEADER_SAFE
    recipients = ['"reply+q"@app.example.com', '"a, b%c"@x.example', "ü@x.example", "plain.o'k+1@x.example"]
    listed = _envelope_headers("", recipients)["X-Pigeon-Recipients"]
    assert listed.split(", ")[0] == "%22reply+q%22@app.example.com"  # the README's example
    assert [urllib.parse.unquote(address) for address in listed.split(", ")] == recipients


def test_retry_after_reads_seconds_and_http_dates_and_the_wait_is_capped() -> None:
    now = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT
    assert retry_after("20", now) == 20.0
    assert retry_after(" 0 ", now) == 0.0
    assert retry_after("Tue, 14 Nov 2023 22:13:50 GMT", now) == 30.0
    assert retry_after("Tue, 14 Nov 2023 22:00:00 GMT", now) == 0.0  # past: at once
    assert retry_after("9" * 400, now) == float("inf")
    for unreadable in (None, "", "soon", "-5", "1.5", "\u0661\u0662"):
        assert retry_after(unreadable, now) is None
    later = Handoff(Verdict.TRANSIENT, "429", retry_after=float("inf"))
    assert not_before(0.2, later, 300.0) == 300.0
    assert not_before(0.2, Handoff(Verdict.TRANSIENT, "429", retry_after=20.0), 300.0) == 20.0
    assert not_before(40.0, Handoff(Verdict.TRANSIENT, "429", retry_after=20.0), 300.0) == 40.0
    assert not_before(40.0, Handoff(Verdict.TRANSIENT, "500"), 300.0) == 40.0


_INTERNATIONAL = (
    "From: =?utf-8?q?Zo=C3=AB?= Durand <zoe@example.fr>\r\n"
    "To: Service client <support@app.example>,\r\n =?iso-8859-1?q?Andr=E9?= <andre@app.example>\r\n"
    "Subject: =?utf-8?q?Caf=C3=A9?= et thé\r\n"
    "\r\nbody\r\n"
).encode()


def test_json_targets_get_subject_from_and_to_decoded_and_utf8_headers_as_text() -> None:
    body = json.loads(json_body(InboundMessage.of(_INTERNATIONAL, "imap:support", 1.0)))
    assert body["subject"] == "Café et thé"
    assert body["from"] == "Zoë Durand <zoe@example.fr>"
    assert body["to"] == "Service client <support@app.example>, André <andre@app.example>"
    # The header as written, encoded-words and all, but its UTF-8 read as text, not U+FFFD.
    assert ["Subject", "=?utf-8?q?Caf=C3=A9?= et thé"] in body["headers"]
    assert body["raw"].encode() == _INTERNATIONAL
    job = json.loads(SidekiqTarget(SidekiqConfig(name="jobs"), "redis://127.0.0.1:1/0").job(
        InboundMessage.of(_INTERNATIONAL, "imap:support", 1.0), 1.0))  # fmt: skip
    assert (job["args"][1]["subject"], job["args"][1]["from"]) == ("Café et thé", "Zoë Durand <zoe@example.fr>")


@pytest.mark.parametrize(
    ("raw", "subject"),
    [
        (b"Subject: caf\xe9 pm\r\n\r\nbody\r\n", "caf\u00e9 pm"),  # no charset declared: Windows-1252
        (b"Subject: \x93quoted\x94\r\n\r\n", "\u201cquoted\u201d"),  # Windows-1252's own quotes
        (b"Content-Type: text/plain;\r\n charset=koi8-r\r\nSubject: \xf0\xd2\xc9\xd7\xc5\xd4\r\n\r\n", "Привет"),
        (b'Content-Type: text/plain; charset="utf-16"\r\nSubject: caf\xe9\r\n\r\n', "caf\u00e9"),  # not ASCII's
        (b"Content-Type: text/plain; charset=x-unknown\r\nSubject: caf\xe9\r\n\r\n", "caf\u00e9"),
        (b"Subject: Zo\xc3\xab\r\nX-Other: caf\xe9\r\n\r\n", "Zo\u00eb"),  # UTF-8 beside Latin-1
    ],
    ids=["latin-1", "cp1252", "declared", "not-ascii-compatible", "unknown", "utf-8-beside"],
)
def test_8bit_header_bytes_that_are_not_utf8_read_as_their_charset_not_replacement_characters(
    raw: bytes, subject: str
) -> None:
    # Found from outside: a Latin-1 `Subject: caf\xe9 pm` reached Sidekiq and PostgreSQL as
    # "caf\ufffd pm".
    message = InboundMessage.of(raw, "imap:support", 1.0)
    assert message.metadata()["subject"] == subject
    body = json.loads(json_body(message))
    assert body["subject"] == subject and "\ufffd" not in json.dumps(body["headers"], ensure_ascii=False)
    assert base64.b64decode(body["raw"]) == raw or body["raw"].encode() == raw  # the bytes untouched


def test_decoded_fields_are_none_when_missing_and_never_carry_control_characters() -> None:
    meta = InboundMessage.of(b"Subject: a\x00b =?x-unknown?q?z?=\r\n\r\n", "smtp", 1.0).metadata()
    assert (meta["from"], meta["to"]) == (None, None)
    assert "\x00" not in meta["subject"] and meta["subject"].startswith("ab")


@given(
    st.sampled_from(["Subject", "Comments", "Keywords"]),
    st.text(st.sampled_from('ab =?\t\r\n"(),<>@\\:;é€日\ufffd\u00a0\u2028\u3000\x85\x01\x00\x7f'), max_size=40),
)
def test_decoded_text_values_are_what_the_email_package_reads(name: str, value: str) -> None:
    # Values without an encoded-word take a short cut past the email package: the same text.
    from email.headerregistry import HeaderRegistry, UnstructuredHeader

    registry = HeaderRegistry(default_class=UnstructuredHeader, use_default_map=False)
    unfolded = re.sub(r"\r\n|\r|\n", "", value)
    read = unfolded if broken_b_word(unfolded) else str(registry(name, unfolded))
    expected = re.sub(r"[\x00-\x08\x0a-\x1f\x7f]", "", read).strip()
    assert decode_value(name, value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("=?utf-8?b?!!!broken?=", "=?utf-8?b?!!!broken?="),
        ("re: =?utf-8?B?Q2Fmw6k=?= =?utf-8?b?#?=", "re: =?utf-8?B?Q2Fmw6k=?= =?utf-8?b?#?="),
        ("=?utf-8?B?Q2Fmw6k?= ok", "Café ok"),  # padding left out: forgiven, as everyone does
        ("=?utf-8?q?Caf=C3=A9!?=", "Café!"),
    ],
)
def test_a_b_encoded_word_that_is_not_base64_is_given_as_written(value: str, expected: str) -> None:
    assert decode_value("Subject", value) == expected


def test_a_long_broken_word_is_read_in_linear_time() -> None:
    start = time.process_time()
    for text in ("=?a?b?" + "!" * 200_000, "=?a?b?" * 50_000, "=?a?b?!?=" * 20_000):
        decode_value("Subject", text)
    assert time.process_time() - start < 2.0


def _b_word(text: str) -> str:
    return "=?utf-8?b?" + base64.b64encode(text.encode()).decode() + "?="


@pytest.mark.parametrize(
    ("value", "pairs"),
    [
        # The spoof: decoded as plain text this read as ceo@company.test first.
        ("=?utf-8?q?=3Cceo=40company=2Etest=3E=2C?= <attacker@evil.test>",
         [("<ceo@company.test>,", "attacker@evil.test")]),
        ("=?utf-8?q?Doe=2C_J=C3=B6hn?= <j@x.test>", [("Doe, Jöhn", "j@x.test")]),
        ("=?utf-8?q?a=5Cb=22c?= <a@x.test>, =?utf-8?q?J=2E_Doe=3A=3B?= <b@x.test>",
         [('a\\b"c', "a@x.test"), ("J. Doe:;", "b@x.test")]),
        ("Team=?utf-8?q?=2C?=: =?utf-8?q?x=40y?= <a@x.test>, b@x.test;", [("x@y", "a@x.test"), ("", "b@x.test")]),
        # A comment stays one: its ")" escaped.
        ("j@x.test (=?utf-8?q?=29_=3Cceo=40company.test=3E?=)", [(") <ceo@company.test>", "j@x.test")]),
    ],
)  # fmt: skip
def test_a_display_name_with_specials_is_quoted_so_the_address_parses_as_sent(
    value: str, pairs: list[tuple[str, str]]
) -> None:
    for name in ("From", "To", "Cc", "Reply-To"):
        assert getaddresses([decode_value(name, value)]) == pairs
    meta = InboundMessage.of(f"From: {value}\r\nTo: {value}\r\n\r\nbody\r\n".encode(), "smtp", 1.0).metadata()
    assert getaddresses([meta["from"]]) == getaddresses([meta["to"]]) == pairs


def test_plain_display_names_stay_as_they_are_and_the_subject_is_still_plain_text() -> None:
    assert decode_value("From", "=?utf-8?q?Zo=C3=AB?= Durand <zoe@example.fr>") == "Zoë Durand <zoe@example.fr>"
    assert decode_value("To", '"Doe, J" <j@x.test>, =?utf-8?q?A?= <a@x.test>') == '"Doe, J" <j@x.test>, A <a@x.test>'
    assert decode_value("Subject", "=?utf-8?q?Doe=2C_J=C3=B6hn?= <j@x.test>") == "Doe, Jöhn <j@x.test>"


def test_encoded_words_where_no_display_name_stands_are_left_as_written() -> None:
    for value in ("=?utf-8?q?ceo?=@company.test", "=?utf-8?q?a?= b@x.test", "=?utf-8?q?Doe,_J?= <j@x.test>"):
        assert decode_value("From", value) == value


@given(
    st.lists(
        st.tuples(
            st.text(st.sampled_from(' ab,<>@"\\:;()[].=?é日'), max_size=20),
            st.sampled_from(["a@x.test", "b.c@y.test", '"q u"@x.test']),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_decoded_address_fields_parse_as_the_addresses_and_names_sent(pairs: list[tuple[str, str]]) -> None:
    value = ",\r\n ".join(f"{_b_word(name)} <{address}>" for name, address in pairs)
    assert getaddresses([decode_value("To", value)]) == [(name.strip(), address) for name, address in pairs]


@given(
    st.lists(
        st.sampled_from(["=?utf-8?q?=3Cc=40d=3E=2C?=", "=?utf-8?q?=29=28?=", " ", "a", "@", "<", ">", ",", ";", ":",
                         '"', "\\", "(", ")", "[", "]", ".", "é", "=?", "\t", "\r\n "]),
        max_size=30,
    ).map("".join),
)  # fmt: skip
def test_any_address_field_decodes_to_text_that_parses_as_the_same_addresses(value: str) -> None:
    unfolded = re.sub(r"\r\n|\r|\n", "", value)
    addresses = [address for _, address in getaddresses([decode_value("From", value)])]
    assert addresses == [address for _, address in getaddresses([unfolded.strip()])]


def test_a_sidekiq_push_marker_outlives_the_max_age_of_the_target_s_smtp_mail(tmp_path: Path) -> None:
    from pigeon.config.load import load_text
    from pigeon.inbound import targets
    from pigeon.node.inbound import inbound_max_age

    text = """
[[target]]
name = "jobs"
kind = "sidekiq"

[[target]]
name = "slow"
kind = "sidekiq"

[[queue]]
name = "inbound:slow"
max_age = "20d"
"""
    config = load_text(text, tmp_path / "pigeon.toml")
    built = {t.name: targets.build(t, None, max_age=inbound_max_age(config, t.name)) for t in config.target}
    assert isinstance(built["jobs"], SidekiqTarget) and isinstance(built["slow"], SidekiqTarget)
    assert built["jobs"].marker_ttl == 7 * 86400  # the default max_age (5 days) and room
    assert built["slow"].marker_ttl == 21 * 86400  # its queue's max_age and a day
