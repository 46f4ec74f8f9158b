"""What one injection request has the spool store is bounded.

Raw content sent as it is (`"template": false`) is every recipient's alike: it is stored once,
as SMTP stores one body for the recipients of a transaction, in one spool message per domain
holding that domain's recipients; 10 MB to 20 recipients of one domain stored 20 bodies (200
MB), and 25 MiB to [http] max_recipients (10,000) would have stored 250 GB. Recipients whose
metadata differ are in messages of their own (a message's log records carry its metadata).

Whatever the content, the bytes of messages one request stores are at most [http]
max_stored_size: beyond, 413 naming the setting, nothing stored (README: Injection)."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import wait_until

TOKEN = "stored-once-token-0123456789"
MAX_STORED = 1024 * 1024
BODY = "x" * 70 + "\r\n"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    """Delivery off: what is taken stays in the spool, to be counted."""
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    root = tmp_path_factory.mktemp("stored-once") / "node"
    with PigeonProcess(root, http=http, smtp={"max_recipients": 8}) as node:
        yield node


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    """A node whose requests may store 1 MiB each."""
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}], "max_stored_size": "1MiB"}
    root = tmp_path_factory.mktemp("stored-size") / "node"
    with PigeonProcess(root, http=http) as node:
        yield node


def _raw(subject: str, size: int) -> str:
    return f"From: app@example.org\r\nSubject: {subject}\r\n\r\n" + BODY * (size // len(BODY))


def _queued(node: PigeonProcess, subject: str) -> list[dict]:  # type: ignore[type-arg]
    return [m for m in node.spool_messages() if f"Subject: {subject}\r\n".encode() in m["data"]]


def test_raw_content_to_many_recipients_is_stored_once_per_domain(node: PigeonProcess) -> None:
    recipients = [f"u{n}@hold.example" for n in range(6)] + ["v0@other.example", "v1@other.example"]
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": email} for email in recipients],
        "content": _raw("once", 200_000),
        "template": False,
    }
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert status == 200, answer
    assert answer["accepted"] == 8
    queued = _queued(node, "once")
    # One message per domain, holding its recipients; one body for them all.
    assert sorted((m["queue"], sorted(m["recipients"])) for m in queued) == [
        ("hold.example", recipients[:6]),
        ("other.example", recipients[6:]),
    ]
    assert len({m["body_id"] for m in queued}) == 1
    by_domain = {m["queue"]: m["id"] for m in queued}
    assert [r["id"] for r in answer["recipients"]] == [by_domain["hold.example"]] * 6 + [by_domain["other.example"]] * 2
    # One Reception per message, naming its recipients, as over SMTP.
    receptions = wait_until(lambda: [r for r in node.records("Reception") if r["id"] in by_domain.values()])
    assert sorted(len(r["recipients"]) for r in receptions) == [2, 6]


def test_recipients_past_smtp_max_recipients_or_with_other_metadata_are_other_messages(node: PigeonProcess) -> None:
    """A message holds at most [smtp] max_recipients (8 here), as an SMTP transaction does, and
    one metadata: 10 recipients with none and 2 with their own make 3 messages, 3 bodies."""
    plain = [{"email": f"p{n}@hold.example"} for n in range(10)]
    tagged = [{"email": f"t{n}@hold.example", "metadata": {"user": "42"}} for n in range(2)]
    request = {
        "envelope_sender": "app@example.org",
        "recipients": plain + tagged,
        "content": _raw("metadata", 1000),
        "template": False,
    }
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert status == 200, answer
    queued = _queued(node, "metadata")
    assert sorted((len(m["recipients"]), str(m["envelope"].metadata)) for m in queued) == [
        (2, "None"),
        (2, "{'user': '42'}"),
        (8, "None"),
    ]
    assert len({m["body_id"] for m in queued}) == 3
    # Every copy is the one message: one Message-ID for all.
    message_ids = {line for m in queued for line in m["data"].split(b"\r\n") if line.startswith(b"Message-ID:")}
    assert len(message_ids) == 1


def test_a_request_that_would_store_more_than_max_stored_size_is_refused_whole(small: PigeonProcess) -> None:
    """Parts are each recipient's own (its To): 20 messages with a 100 KB attachment pass 1 MiB."""
    attachment = base64.b64encode(b"\x00" * 100_000).decode()
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": f"big{n}@hold.example"} for n in range(20)],
        "content": {
            "from": {"email": "app@example.org"},
            "subject": "big",
            "text": "see attached",
            "attachments": [{"data": attachment, "base64": True, "file_name": "a.bin"}],
        },
    }
    before = len(small.spool_messages())
    status, answer = small.http_post("/api/v1/inject", request, TOKEN)
    assert status == 413, answer
    assert answer["field"] == "$.recipients"
    assert "over [http] max_stored_size (1048576 bytes)" in answer["error"], answer
    assert answer["error"].startswith("20 recipients' messages of "), answer
    assert len(small.spool_messages()) == before
    logged = wait_until(lambda: [r for r in small.records("Rejection") if "max_stored_size" in r["response"]["text"]])
    assert logged[0]["command"] == "inject"
    assert logged[0]["response"]["code"] == 413


def test_shared_content_counts_each_message_it_is_stored_for(small: PigeonProcess) -> None:
    """400 KB to recipients of 3 metadata: 3 bodies, 1.2 MB, over 1 MiB: 413, nothing stored."""
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": f"m{n}@hold.example", "metadata": {"n": str(n)}} for n in range(3)],
        "content": _raw("three", 400_000),
        "template": False,
    }
    before = len(small.spool_messages())
    status, answer = small.http_post("/api/v1/inject", request, TOKEN)
    assert status == 413, answer
    assert answer["error"].startswith("3 messages of "), answer
    assert len(small.spool_messages()) == before


def test_a_later_message_made_larger_by_its_substitutions_is_refused_for_now(small: PigeonProcess) -> None:
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [
            {"email": "small@hold.example", "substitutions": {"text": "hi"}},
            {"email": "large@hold.example", "substitutions": {"text": "y" * 1_100_000}},
        ],
        "content": {"from": {"email": "app@example.org"}, "subject": "grows", "text": "{{ text }}"},
    }
    status, answer = small.http_post("/api/v1/inject", request, TOKEN)
    assert status == 200, answer
    first, second = answer["recipients"]
    assert "id" in first
    assert second["error"].startswith("452 4.3.1 The request's messages would pass [http] max_stored_size"), second
