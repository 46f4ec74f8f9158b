"""A rule enforced at one door holds at every door (SMTP relay, SMTP after AUTH, HTTP
injection, `pigeon inject`):

* `[smtp] max_message_size` counts the message as the client gave it: the Date and
  Message-ID Pigeon adds to a submission without them (and its Received field) are not the
  client's octets. A message of exactly the limit is taken at every door with or without its
  own Date and Message-ID; one octet more is refused at every door, with the limit named.
  (HTTP counted Pigeon's ~105 octets against the client: 9895 taken, 9896 refused.)
* A submission without a From field (RFC 5322 3.6 requires one) is refused at every door
  that completes one (SMTP after AUTH, HTTP raw content, `pigeon inject`), with one text, and
  logged as a Rejection; parts already required `from`. Relayed mail is left as it came.
* So is a submission whose Date is not an RFC 5322 date-time (a day of the week not the
  date's too), or whose Message-ID is not a msg-id (`<a..b@c>` neither): said at submission,
  naming the field and what is wrong, not in a bounce from a receiver that wants "a valid
  Message-ID". Real mailers' forms (obsolete ones included) pass; relayed mail is left as it
  came."""

from __future__ import annotations

import smtplib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pigeon.listener.passwords import set_password
from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.sinks import wait_until

TOKEN = "doors-token-0123456789"
LIMIT = 10000
OWN = b"Date: Mon, 1 Jan 2024 00:00:00 +0000\r\nMessage-ID: <own@example.org>\r\n"
TOO_BIG = f"552 5.3.4 Message size exceeds fixed maximum message size of {LIMIT} octets"
NO_FROM = "554 5.6.0 Message has no From header field (RFC 5322 3.6 requires one): add From: with the author's address"
DOORS = ["smtp-relay", "smtp-auth", "http", "cli"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    root = tmp_path_factory.mktemp("doors")
    users = root / "users"
    set_password(users, "app", "secret-password")
    smtp = {"max_message_size": LIMIT, "auth_users": str(users), "allow_plaintext_auth": True}
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    with PigeonProcess(root / "node", smtp=smtp, http=http) as running:
        yield running


def _message(size: int, own: bool) -> bytes:
    """A message of exactly `size` octets (CRLF line endings, the last line ended)."""
    head = (OWN if own else b"") + b"From: a@example.org\r\nTo: b@example.net\r\nSubject: size\r\n\r\n"
    left = size - len(head)
    lines = [b"x" * 76 + b"\r\n"] * (left // 78)
    rest = left - 78 * len(lines)
    if rest:
        assert rest >= 2
        lines.append(b"y" * (rest - 2) + b"\r\n")
    message = head + b"".join(lines)
    assert len(message) == size
    return message


def _smtp(node: PigeonProcess, message: bytes, *, login: bool) -> str:
    """The reply to the message's end of data: "250" or the refusal. MAIL declares no SIZE:
    the limit is checked on the data."""
    with smtplib.SMTP("127.0.0.1", node.smtp_port, timeout=30) as client:
        client.ehlo()
        if login:
            client.login("app", "secret-password")
        assert client.mail("a@example.org")[0] == 250
        assert client.rcpt("b@example.net")[0] == 250
        code, text = client.data(message)
    return "250" if code == 250 else f"{code} {text.decode()}"


def _http(node: PigeonProcess, message: bytes, *, template: bool = True) -> tuple[int, Any]:
    request = {
        "envelope_sender": "a@example.org",
        "recipients": [{"email": "b@example.net"}],
        "content": message.decode(),
        "template": template,
    }
    return node.http_post("/api/v1/inject", request, TOKEN)


def _cli(node: PigeonProcess, message: bytes, *options: str) -> subprocess.CompletedProcess[bytes]:
    command = ["inject", "-c", str(node.config_path), "--token", TOKEN, *options]
    command += ["--from", "a@example.org", "--to", "b@example.net", "-"]
    return zygote.run(command, input=message, timeout=60, check=False)


def _outcome(node: PigeonProcess, door: str, message: bytes) -> str:
    """What the door answered: "250" when it took the message, else the refusal. Injected as
    it is, not as a template (content rendered per recipient is refused per recipient)."""
    if door.startswith("smtp"):
        return _smtp(node, message, login=door == "smtp-auth")
    if door == "http":
        status, answer = _http(node, message, template=False)
        if status == 200 and answer["accepted"] == 1:
            return "250"
        assert (status, answer.get("field")) == (400, "$.content"), answer
        return str(answer["error"])
    done = _cli(node, message, "--no-template")
    if done.returncode == 0:
        return "250"
    assert done.returncode == 2, done
    return done.stderr.decode().removeprefix("pigeon: 400: ").rstrip("\n").removesuffix(" ($.content)")


@pytest.mark.parametrize("own", [False, True], ids=["without-date-and-id", "with-own-date-and-id"])
@pytest.mark.parametrize("door", DOORS)
def test_the_size_limit_counts_the_message_as_the_client_gave_it(node: PigeonProcess, door: str, own: bool) -> None:
    assert _outcome(node, door, _message(LIMIT, own)) == "250"
    assert _outcome(node, door, _message(LIMIT + 1, own)) == TOO_BIG


def test_an_injection_of_exactly_the_limit_is_stored_with_pigeons_date_and_message_id(node: PigeonProcess) -> None:
    """Not counted is not left out: the stored message has them."""
    before = {row["id"] for row in node.spool_messages()}
    status, answer = _http(node, _message(LIMIT, own=False), template=False)
    assert (status, answer["accepted"]) == (200, 1), answer
    (row,) = [row for row in node.spool_messages() if row["id"] not in before]
    assert len(row["data"]) > LIMIT + 100  # with the Received, Date and Message-ID fields Pigeon wrote
    assert b"\r\nDate: " in row["data"] and b"\r\nMessage-ID: <" in row["data"]


NO_FROM_CONTENT = {
    "subject only": b"Subject: no from\r\n\r\nx\r\n",
    "empty": b"",
    # A From without a mailbox (RFC 5322 3.6.2 requires one) names no author either.
    "empty from": b"From:\r\nSubject: empty from\r\n\r\nx\r\n",
    "blank folded from": b"From : \t\r\n \r\nSubject: blank from\r\n\r\nx\r\n",
}


def _rejections(node: PigeonProcess, command: str, code: int) -> int:
    return sum(
        1
        for r in node.records("Rejection")
        if r["command"] == command
        and r["response"]["code"] == code
        and NO_FROM.split(" ", 2)[2] in r["response"]["text"]
    )


@pytest.mark.parametrize("content", list(NO_FROM_CONTENT))
def test_a_submission_without_from_is_refused_over_smtp_after_auth(node: PigeonProcess, content: str) -> None:
    before = _rejections(node, "DATA", 554)
    assert _smtp(node, NO_FROM_CONTENT[content], login=True) == NO_FROM
    wait_until(lambda: _rejections(node, "DATA", 554) == before + 1)


@pytest.mark.parametrize("template", [True, False], ids=["template", "as-it-is"])
@pytest.mark.parametrize("content", list(NO_FROM_CONTENT))
def test_an_injection_without_from_is_refused_whole(node: PigeonProcess, content: str, template: bool) -> None:
    before, stored = _rejections(node, "inject", 400), len(node.spool_messages())
    status, answer = _http(node, NO_FROM_CONTENT[content], template=template)
    assert (status, answer) == (400, {"error": NO_FROM, "field": "$.content"})
    wait_until(lambda: _rejections(node, "inject", 400) == before + 1)
    assert len(node.spool_messages()) == stored


@pytest.mark.parametrize("options", [[], ["--template"]], ids=["as-it-is", "template"])
def test_pigeon_inject_of_a_message_without_from_exits_2_with_the_reply(
    node: PigeonProcess, options: list[str]
) -> None:
    done = _cli(node, NO_FROM_CONTENT["subject only"], *options)
    assert done.returncode == 2, done
    assert f"pigeon: 400: {NO_FROM} ($.content)" in done.stderr.decode()


def test_a_later_recipient_whose_template_leaves_out_from_is_refused_alone(node: PigeonProcess) -> None:
    content = "{% if with_from %}From: a@example.org\n{% endif %}Subject: hi\n\nbody\n"
    recipients = [
        {"email": "ann@example.net", "substitutions": {"with_from": True}},
        {"email": "bob@example.net", "substitutions": {"with_from": False}},
    ]
    request = {"envelope_sender": "a@example.org", "recipients": recipients, "content": content}
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert status == 200, answer
    assert (answer["accepted"], answer["recipients"][1]) == (1, {"email": "bob@example.net", "error": NO_FROM})


@pytest.mark.parametrize("content", ["subject only", "empty from"])
def test_relayed_mail_without_from_is_left_as_it_came(node: PigeonProcess, content: str) -> None:
    assert _smtp(node, NO_FROM_CONTENT[content], login=False) == "250"


@pytest.mark.parametrize("door", ["smtp-auth", "http", "cli"])
def test_a_submission_with_an_empty_from_gets_the_reply_of_one_without(node: PigeonProcess, door: str) -> None:
    assert _outcome(node, door, NO_FROM_CONTENT["empty from"]) == NO_FROM


def test_a_from_far_down_a_long_header_section_is_found(tmp_path: Path) -> None:
    """Past the 64 KiB of the header section the intake keeps, the From is still seen."""
    users = tmp_path / "users"
    set_password(users, "app", "secret-password")
    smtp = {"auth_users": str(users), "allow_plaintext_auth": True}
    filler = b"".join(b"X-Filler-%05d: %s\r\n" % (n, b"f" * 60) for n in range(1200))
    with PigeonProcess(tmp_path / "node", smtp=smtp) as node:
        assert _smtp(node, filler + b"From: a@example.org\r\n\r\nbody\r\n", login=True) == "250"
        assert _smtp(node, filler + b"Subject: none\r\n\r\nbody\r\n", login=True) == NO_FROM
        assert _smtp(node, filler + b"From:  \r\nSubject: empty\r\n\r\nbody\r\n", login=True) == NO_FROM


BAD_DATE = (
    '554 5.6.0 Message has a Date header field that is not an RFC 5322 date: "yesterday" is not of the form'
    ' "Mon, 1 Jan 2024 12:00:00 +0000" (leave it out and Pigeon adds one)'
)
BAD_MESSAGE_ID = (
    '554 5.6.0 Message has a Message-ID header field that is not an RFC 5322 msg-id: "<no-at-sign>" has no "@"'
    ' (the form is "<1234.5678@example.org>") (leave it out and Pigeon adds one)'
)
BAD_WEEKDAY = (
    '554 5.6.0 Message has a Date header field that is not an RFC 5322 date: "Mon, 5 Dec 2026 10:00:00 +0000" has'
    ' "Mon" for the day of the week, but 5 Dec 2026 is a Saturday (leave it out and Pigeon adds one)'
)
BAD_DOTS = (
    '554 5.6.0 Message has a Message-ID header field that is not an RFC 5322 msg-id: "<a..b@example.org>" has ".."'
    ' before its "@" (RFC 5322 3.6.4: a dot only between two other characters) (leave it out and Pigeon adds one)'
)
BAD_FIELDS = {
    "date": (b"Date: yesterday\r\n", BAD_DATE),
    "message-id": (b"Message-ID:\r\n <no-at-sign>\r\n", BAD_MESSAGE_ID),  # folded: shown unfolded
    # RFC 5322 3.3: the day of the week MUST be the date's; 3.6.4: id-left is a dot-atom-text
    "weekday": (b"Date: Mon, 5 Dec 2026 10:00:00 +0000\r\n", BAD_WEEKDAY),
    "message-id-dots": (b"Message-ID: <a..b@example.org>\r\n", BAD_DOTS),
}
REAL_WORLD = {
    "rfc 5322": b"Date: Mon, 1 Jan 2024 12:00:00 +0100\r\nMessage-ID: <1234.5678@example.org>\r\n",
    "obsolete": b'Date: 1 Jan 24 12:00 EST\r\nMessage-ID: <"quoted.left"@[192.0.2.1]>\r\n',
    "comments": b"Date: Mon,  1 Jan 2024 12:00:00 +0000 (UTC)\r\nMessage-ID: (ours) <a.b@example.org>\r\n",
    "named zone": b"Date: mon, 01 JAN 2024 12:00:00 GMT\r\nMessage-ID: <CAF=x+y_z@mail.gmail.com>\r\n",
}


def _with(fields: bytes) -> bytes:
    return b"From: a@example.org\r\n" + fields + b"To: b@example.net\r\nSubject: fields\r\n\r\nbody\r\n"


def _refused(node: PigeonProcess, command: str, code: int, reply: str) -> int:
    """Rejection records of `command` with `code` that say `reply`'s text (a 400's says it
    whole, code and field included)."""
    text = reply.split(" ", 2)[2]
    return sum(
        1
        for r in node.records("Rejection")
        if r["command"] == command and r["response"]["code"] == code and text in r["response"]["text"]
    )


@pytest.mark.parametrize("field", list(BAD_FIELDS))
def test_a_submission_with_a_date_or_message_id_not_of_rfc_5322_is_refused_over_smtp_after_auth(
    node: PigeonProcess, field: str
) -> None:
    fields, reply = BAD_FIELDS[field]
    before, stored = _refused(node, "DATA", 554, reply), len(node.spool_messages())
    assert _smtp(node, _with(fields), login=True) == reply
    wait_until(lambda: _refused(node, "DATA", 554, reply) == before + 1)
    assert len(node.spool_messages()) == stored


@pytest.mark.parametrize("template", [True, False], ids=["template", "as-it-is"])
@pytest.mark.parametrize("field", list(BAD_FIELDS))
def test_an_injection_with_a_date_or_message_id_not_of_rfc_5322_is_refused_whole(
    node: PigeonProcess, field: str, template: bool
) -> None:
    fields, reply = BAD_FIELDS[field]
    before, stored = _refused(node, "inject", 400, reply), len(node.spool_messages())
    status, answer = _http(node, _with(fields), template=template)
    assert (status, answer) == (400, {"error": reply, "field": "$.content"})
    wait_until(lambda: _refused(node, "inject", 400, reply) == before + 1)
    assert len(node.spool_messages()) == stored


def test_an_injection_in_parts_with_a_bad_date_header_is_refused(node: PigeonProcess) -> None:
    parts = {"from": {"email": "a@example.org"}, "subject": "s", "text": "t", "headers": {"Date": "yesterday"}}
    request = {"envelope_sender": "a@example.org", "recipients": [{"email": "b@example.net"}], "content": parts}
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer) == (400, {"error": BAD_DATE, "field": "$.content.headers.Date"})


@pytest.mark.parametrize("field", list(BAD_FIELDS))
def test_a_later_recipient_whose_template_makes_a_bad_date_or_message_id_is_refused_alone(
    node: PigeonProcess, field: str
) -> None:
    fields, reply = BAD_FIELDS[field]
    content = "{% if bad %}" + fields.decode() + "{% endif %}From: a@example.org\nSubject: hi\n\nbody\n"
    recipients = [
        {"email": "ann@example.net", "substitutions": {"bad": False}},
        {"email": "bob@example.net", "substitutions": {"bad": True}},
    ]
    before = _refused(node, "inject", 554, reply)
    request = {"envelope_sender": "a@example.org", "recipients": recipients, "content": content}
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert status == 200, answer
    assert (answer["accepted"], answer["recipients"][1]) == (1, {"email": "bob@example.net", "error": reply})
    wait_until(lambda: _refused(node, "inject", 554, reply) == before + 1)


@pytest.mark.parametrize("field", list(BAD_FIELDS))
def test_pigeon_inject_of_a_message_with_a_bad_date_or_message_id_exits_2_with_the_reply(
    node: PigeonProcess, field: str
) -> None:
    fields, reply = BAD_FIELDS[field]
    for options in ([], ["--template"]):
        done = _cli(node, _with(fields), *options)
        assert done.returncode == 2, done
        assert f"pigeon: 400: {reply} ($.content)" in done.stderr.decode()


@pytest.mark.parametrize("door", ["smtp-auth", "http", "cli"])
@pytest.mark.parametrize("form", list(REAL_WORLD))
def test_dates_and_message_ids_as_real_mailers_write_them_are_taken_at_every_door(
    node: PigeonProcess, door: str, form: str
) -> None:
    before = {row["id"] for row in node.spool_messages()}
    assert _outcome(node, door, _with(REAL_WORLD[form])) == "250"
    (row,) = [row for row in node.spool_messages() if row["id"] not in before]
    assert REAL_WORLD[form] in row["data"]  # sent as they came: not replaced by Pigeon's


@pytest.mark.parametrize("field", list(BAD_FIELDS))
def test_relayed_mail_with_a_bad_date_or_message_id_is_relayed_as_it_came(node: PigeonProcess, field: str) -> None:
    fields, _ = BAD_FIELDS[field]
    before = {row["id"] for row in node.spool_messages()}
    assert _smtp(node, _with(fields), login=False) == "250"
    (row,) = [row for row in node.spool_messages() if row["id"] not in before]
    assert fields in row["data"]


def test_a_date_that_runs_past_the_kept_part_of_a_long_header_section_is_read_whole(tmp_path: Path) -> None:
    """The intake keeps the first 64 KiB of a header section: a Date field that the end of
    that part cuts is read whole, not as the date it would be cut to (an open comment), nor
    let through unread."""
    users = tmp_path / "users"
    set_password(users, "app", "secret-password")
    smtp = {"auth_users": str(users), "allow_plaintext_auth": True}
    filler = b"".join(b"X-Filler-%05d: %s\r\n" % (n, b"f" * 60) for n in range(800))  # 63,200 octets
    comment = b"".join(b"\r\n %s" % (b"c" * 70) for _ in range(60))  # 4,380 octets, across 64 KiB
    date = b"Date: Mon, 1 Jan 2024 12:00:00 +0000 (" + comment + b")\r\n"
    message = filler + b"From: a@example.org\r\n" + date + b"Message-ID: <big@example.org>\r\n\r\nbody\r\n"
    with PigeonProcess(tmp_path / "node", smtp=smtp) as node:
        assert _smtp(node, message, login=True) == "250"
        assert _smtp(node, message.replace(b"12:00:00", b"25:00:00"), login=True) == (
            '554 5.6.0 Message has a Date header field that is not an RFC 5322 date: "Mon, 1 Jan 2024 25:00:00 +0000 ( '
            + "c" * 47
            + '..." has hour 25 (two digits, 00 to 23) (leave it out and Pigeon adds one)'
        )
        bad = b"Date: Mon, 1 Jan 2024 25:00:00 +0000\r\n" + filler + b"From: a@example.org\r\n\r\nbody\r\n"
        assert _smtp(node, bad, login=True) == (
            '554 5.6.0 Message has a Date header field that is not an RFC 5322 date: "Mon, 1 Jan 2024 25:00:00 +0000"'
            " has hour 25 (two digits, 00 to 23) (leave it out and Pigeon adds one)"
        )


LATE = b"".join(b"X-Filler-%05d: %s\r\n" % (n, b"f" * 80) for n in range(900))  # 88 KB: past the kept 64 KiB


@pytest.fixture(scope="module")
def roomy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    """A node as `node`, with room for a long header section (the default size limit)."""
    root = tmp_path_factory.mktemp("roomy")
    users = root / "users"
    set_password(users, "app", "secret-password")
    smtp = {"auth_users": str(users), "allow_plaintext_auth": True}
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    with PigeonProcess(root / "node", smtp=smtp, http=http) as running:
        yield running


@pytest.mark.parametrize("door", ["smtp-auth", "http", "cli"])
@pytest.mark.parametrize("field", list(BAD_FIELDS))
def test_a_bad_date_or_message_id_past_64_kib_of_other_fields_is_refused_as_one_first(
    roomy: PigeonProcess, door: str, field: str
) -> None:
    """Far down a long header section, where the intake keeps no more of it: Pigeon saw a Date
    there, added none, and the message left with `Date: garbage`."""
    fields, reply = BAD_FIELDS[field]
    stored = len(roomy.spool_messages())
    message = b"From: a@example.org\r\n" + LATE + fields + b"Subject: late\r\n\r\nbody\r\n"
    assert _outcome(roomy, door, message) == reply
    assert len(roomy.spool_messages()) == stored


@pytest.mark.parametrize("door", ["smtp-auth", "http", "cli"])
def test_a_good_date_and_message_id_past_64_kib_of_other_fields_are_kept_and_none_added(
    roomy: PigeonProcess, door: str
) -> None:
    before = {row["id"] for row in roomy.spool_messages()}
    fields = b"Date: Sat, 5 Dec 2026 10:00:00 +0000\r\nMessage-ID: <late.one@example.org>\r\n"
    assert _outcome(roomy, door, b"From: a@example.org\r\n" + LATE + fields + b"Subject: late\r\n\r\nbody\r\n") == "250"
    (row,) = [row for row in roomy.spool_messages() if row["id"] not in before]
    data = row["data"]
    assert fields in data and data.count(b"\r\nDate:") == 1 and data.lower().count(b"\r\nmessage-id:") == 1
