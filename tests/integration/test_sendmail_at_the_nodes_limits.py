"""`pigeon sendmail` at the node's limits and with recipient arguments as callers write them:
more recipients than `[smtp] max_recipients` still reach all of them (in further transactions,
as RFC 5321 4.5.3.1.10 asks after a `452 4.5.3`), a message of exactly `[smtp]
max_message_size` is refused at MAIL, before its content is sent, saying why (the `Received`
field sendmail puts first counts against the limit, as Postfix counts its sendmail's, and so do
the Date and Message-ID it adds, each named with its octets; its SIZE= declares them), while
the other doors take it, and an argument that is no address is refused naming it."""

from __future__ import annotations

import re
import smtplib
from collections.abc import Iterator

import pytest

from pigeon.logs.peer_text import shown
from tests.integration.test_sendmail import POLICY, sendmail
from tests.support.process import PigeonProcess
from tests.support.sinks import Received, ScriptedSink, delivery_config, wait_until

LIMIT = 20 * 1024


@pytest.fixture(scope="module")
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as sink:
        yield sink


@pytest.fixture(scope="module")
def node(sink: ScriptedSink, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    root = tmp_path_factory.mktemp("node")
    (root / "sendmail_policy.py").write_text(POLICY)
    sections = delivery_config(sink.endpoint)
    smtp = {"max_message_size": "20KiB", "max_recipients": 5}
    with PigeonProcess(root, smtp=smtp, policy={"module": "sendmail_policy"}, **sections) as pigeon:
        yield pigeon


def all_arrived(sink: ScriptedSink, marker: bytes, recipients: int) -> list[Received]:
    """The messages holding `marker` once they have reached `recipients` recipients in all."""

    def done() -> list[Received] | None:
        got = [m for m in sink.received if marker in m.data]
        return got if sum(len(m.recipients) for m in got) >= recipients else None

    return wait_until(done)


def test_more_recipients_than_max_recipients_all_get_it_in_further_transactions(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    recipients = [f"r{n}@rich.test" for n in range(6)]
    result = sendmail(
        node.config_path, "-i", "-f", "a@example.org", *recipients, message=b"Subject: x\n\nmarker-many\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == b""
    got = all_arrived(sink, b"marker-many", 6)
    assert sorted(r for m in got for r in m.recipients) == recipients
    assert sorted(len(m.recipients) for m in got) == [1, 5]  # one message per transaction


def test_t_with_more_addresses_than_max_recipients_sends_to_all(node: PigeonProcess, sink: ScriptedSink) -> None:
    message = (
        b"From: a@example.org\n"
        b"To: t0@rich.test, t1@rich.test\n"
        b"Cc: t2@rich.test, t3@rich.test\n"
        b"Bcc: t4@rich.test, t5@rich.test\n"
        b"Subject: x\n\nmarker-many-t\n"
    )
    result = sendmail(node.config_path, "-t", "-i", message=message)
    assert result.returncode == 0, result.stderr
    got = all_arrived(sink, b"marker-many-t", 6)
    assert sorted(r for m in got for r in m.recipients) == [f"t{n}@rich.test" for n in range(6)]


def test_a_recipient_refused_for_now_in_a_further_transaction_sends_to_no_one(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    # Every transaction has its recipients before any has its message: a 4xx in the second
    # still leaves nothing sent, so that the caller's retry sends it to no one twice.
    recipients = [f"n{n}@rich.test" for n in range(5)] + ["later@rich.test"]
    result = sendmail(node.config_path, "-i", *recipients, message=b"Subject: x\n\nmarker-later\n")
    assert result.returncode == 75, result.stderr
    assert b"<later@rich.test>: 451 4.7.1 not now" in result.stderr and b"nothing sent" in result.stderr
    assert (
        sendmail(node.config_path, "-i", "ok@rich.test", message=b"Subject: x\n\nmarker-later-after\n").returncode == 0
    )
    all_arrived(sink, b"marker-later-after", 1)
    assert not any(b"marker-later\r\n" in m.data for m in sink.received)


def test_a_recipient_refused_for_good_in_a_further_transaction_exits_67_and_the_others_get_it(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    recipients = [f"p{n}@rich.test" for n in range(6)] + ["no@rich.test"]
    result = sendmail(node.config_path, "-i", *recipients, message=b"Subject: x\n\nmarker-no\n")
    assert result.returncode == 67, result.stderr
    assert b"<no@rich.test>: 550 5.7.1 no such user here" in result.stderr
    got = all_arrived(sink, b"marker-no", 6)
    assert sorted(r for m in got for r in m.recipients) == [f"p{n}@rich.test" for n in range(6)]


def a_message_of(size: int, marker: bytes, *, dated: bool = True) -> bytes:
    """A message of exactly `size` octets with CRLF line ends, with its From, and with its Date
    and Message-ID unless not `dated` (sendmail then adds them)."""
    own = b"Date: Mon, 1 Jan 2024 00:00:00 +0000\r\nMessage-ID: <%s@example.org>\r\n" % marker
    head = b"From: a@example.org\r\nTo: big@rich.test\r\n%sSubject: big\r\n\r\n%s\r\n" % (own if dated else b"", marker)
    lines = b""
    while len(head) + len(lines) + 80 <= size:
        lines += b"y" * 78 + b"\r\n"
    rest = size - len(head) - len(lines) - 2
    message = head + lines + b"z" * rest + b"\r\n"
    assert len(message) == size
    return message


SIZE_REFUSED = re.compile(
    rb"([0-9]+) octets as submitted, over the node's limit of 20480 octets \(\[smtp\] max_message_size\),"
    rb" which counts the Received field sendmail puts first \(([0-9]+) octets\), as Postfix counts its sendmail's"
)
SENDMAILS_FIELD = re.compile(rb"Received: by [^\r]* \(Pigeon sendmail, from userid [0-9]+\);\r\n\t[^\r]*\r\n")


def test_a_message_of_exactly_max_message_size_is_refused_at_mail_counting_sendmails_received_field(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    exact = sendmail(node.config_path, "-i", "-v", "-f", "a@example.org", "big@rich.test",
                     message=a_message_of(LIMIT, b"marker-exact"))  # fmt: skip
    assert exact.returncode == 65, exact.stderr
    # What was refused, and why: the message, for its size as it went (not "sender ... refused").
    error = exact.stderr.splitlines()[-1]
    assert error.startswith(b"sendmail: the message refused for its size: "), exact.stderr
    assert error.endswith(b": 552 5.3.4 Message size exceeds fixed maximum message size of 20480 octets")
    why = SIZE_REFUSED.search(error)
    assert why is not None, error
    submitted, own = int(why[1]), int(why[2])
    assert own > 0 and submitted == LIMIT + own
    # At MAIL: its SIZE= declared the message with the field, and its content never went.
    assert b"SIZE=%d" % submitted in exact.stderr
    assert b"send: 'data" not in exact.stderr.lower()
    # One that is the limit with the field is taken; and `own` is the field as it arrived.
    fits = sendmail(node.config_path, "-i", "big@rich.test", message=a_message_of(LIMIT - own, b"marker-fits"))
    assert fits.returncode == 0, fits.stderr
    got = all_arrived(sink, b"marker-fits", 1)[0]
    field = SENDMAILS_FIELD.search(got.data)
    assert field is not None and len(field[0]) == own
    # The other doors count the message as the client gave it: the same message is taken.
    with smtplib.SMTP("127.0.0.1", node.smtp_port, timeout=30) as client:
        client.sendmail("a@example.org", ["big@rich.test"], a_message_of(LIMIT, b"marker-smtp-exact"))
    all_arrived(sink, b"marker-smtp-exact", 1)
    assert not any(b"marker-exact\r\n" in m.data for m in sink.received)


ADDED_REFUSED = re.compile(
    rb"([0-9]+) octets as submitted, over the node's limit of 20480 octets \(\[smtp\] max_message_size\),"
    rb" which counts the Received field sendmail puts first \(([0-9]+) octets\), as Postfix counts its sendmail's,"
    rb" and the Date and Message-ID fields it added \(([0-9]+) octets\): ([0-9]+) octets without them"
)
SENDMAILS_COMPLETION = re.compile(rb"Date: [^\r]*\r\nMessage-ID: <[0-9a-f]{22}@[^\r]*>\r\n")


def test_the_date_and_message_id_sendmail_adds_count_toward_the_limit_and_its_refusal_says_so(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    # The node cannot tell the fields sendmail adds from the caller's (it counts a relay
    # client's every octet: a field recognised by its look any client could write), so they
    # count, as its Received field does; the refusal names each, with their octets, and the
    # size without them, so that the caller knows exactly what fits.
    bare = sendmail(node.config_path, "-i", "-v", "-f", "a@example.org", "big@rich.test",
                    message=a_message_of(LIMIT, b"marker-bare", dated=False))  # fmt: skip
    assert bare.returncode == 65, bare.stderr
    error = bare.stderr.splitlines()[-1]
    assert error.startswith(b"sendmail: the message refused for its size: "), bare.stderr
    why = ADDED_REFUSED.search(error)
    assert why is not None, error
    submitted, received, added, without = (int(number) for number in why.groups())
    assert received > 0 and added > 0 and without == LIMIT and submitted == LIMIT + received + added
    assert b"SIZE=%d" % submitted in bare.stderr
    # Exactly true: the message that size less fits, and what arrives is what was counted.
    fits = LIMIT - received - added
    over = sendmail(
        node.config_path, "-i", "big@rich.test", message=a_message_of(fits + 1, b"marker-over", dated=False)
    )
    assert over.returncode == 65, over.stderr
    fitting = a_message_of(fits, b"marker-bare-fits", dated=False)
    result = sendmail(node.config_path, "-i", "big@rich.test", message=fitting)
    assert result.returncode == 0, result.stderr
    got = all_arrived(sink, b"marker-bare-fits", 1)[0]
    field, completion = SENDMAILS_FIELD.search(got.data), SENDMAILS_COMPLETION.search(got.data)
    assert field is not None and len(field[0]) == received
    assert completion is not None and len(completion[0]) == added
    assert not any(b"marker-over" in m.data for m in sink.received)


def a_session(*lines: bytes, message: bytes = b"") -> bytes:
    return b"".join(line + b"\r\n" for line in lines) + (message + b".\r\nQUIT\r\n" if message else b"")


def test_bs_mail_with_size_of_exactly_max_message_size_is_refused_saying_sendmails_field_counts(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    # The caller's SIZE= grown by the field sendmail puts first: refused at MAIL, with why.
    session = a_session(b"EHLO app.example", b"MAIL FROM:<a@example.org> SIZE=%d" % LIMIT, b"QUIT")
    result = sendmail(node.config_path, "-bs", "-i", message=session)
    assert result.returncode == 0, result.stderr
    replies = [line for line in result.stdout.split(b"\r\n") if line[3:4] == b" "]
    assert [reply[:3] for reply in replies] == [b"220", b"250", b"552", b"221"], result.stdout
    assert replies[2].startswith(b"552 5.3.4 Message size exceeds fixed maximum message size of 20480 octets (")
    why = SIZE_REFUSED.search(replies[2])
    assert why is not None, replies[2]
    own = int(why[2])
    assert own > 0 and int(why[1]) == LIMIT + own
    # Declared at the limit with the field, it is taken.
    message = a_message_of(LIMIT - own, b"marker-bs-fits")
    session = a_session(b"EHLO app.example", b"MAIL FROM:<a@example.org> SIZE=%d" % (LIMIT - own),
                        b"RCPT TO:<big@rich.test>", b"DATA", message=message)  # fmt: skip
    result = sendmail(node.config_path, "-bs", "-i", message=session)
    replies = [line[:3] for line in result.stdout.split(b"\r\n") if line[3:4] == b" "]
    assert replies == [b"220", b"250", b"250", b"250", b"354", b"250", b"221"], result.stdout
    got = all_arrived(sink, b"marker-bs-fits", 1)[0]
    field = SENDMAILS_FIELD.search(got.data)
    assert field is not None and len(field[0]) == own
    # Without SIZE=, the refusal at the end of the data says the same.
    session = a_session(b"EHLO app.example", b"MAIL FROM:<a@example.org>", b"RCPT TO:<big@rich.test>", b"DATA",
                        message=a_message_of(LIMIT, b"marker-bs-exact"))  # fmt: skip
    result = sendmail(node.config_path, "-bs", "-i", message=session)
    replies = [line for line in result.stdout.split(b"\r\n") if line[3:4] == b" "]
    assert [reply[:3] for reply in replies] == [b"220", b"250", b"250", b"250", b"354", b"552", b"221"]
    why = SIZE_REFUSED.search(replies[5])
    assert why is not None and int(why[1]) == LIMIT + own and int(why[2]) == own, replies[5]
    assert not any(b"marker-bs-exact" in m.data for m in sink.received)


def test_bs_bdat_chunks_are_answered_with_the_clients_own_octets(node: PigeonProcess, sink: ScriptedSink) -> None:
    first = b"Subject: x"  # 10 octets: sendmail puts its Received field before them
    second = b"\r\n\r\nmarker-bdat\r\n"
    session = (
        b"EHLO app.example\r\n"
        b"MAIL FROM:<a@example.org>\r\n"
        b"RCPT TO:<bdat@rich.test>\r\n"
        b"BDAT 10\r\n" + first + b"BDAT %d\r\n" % len(second) + second + b"BDAT 0 LAST\r\n"
        b"QUIT\r\n"
    )
    result = sendmail(node.config_path, "-bs", message=session)
    assert result.returncode == 0, result.stderr
    assert b"250 2.0.0 10 octets received\r\n" in result.stdout, result.stdout
    assert b"250 2.0.0 %d octets received\r\n" % (10 + len(second)) in result.stdout, result.stdout
    got = all_arrived(sink, b"marker-bdat", 1)[0]
    assert b"(Pigeon sendmail, from userid" in got.data


@pytest.mark.parametrize(
    "argument", ["a@b@rich.test", "ad\\@x@rich.test", "smq1@rich.test smq2@rich.test", "<>", "Ann <>", "@r1.test"]
)
def test_a_recipient_argument_that_is_no_address_is_refused_with_64_naming_it(
    node: PigeonProcess, sink: ScriptedSink, argument: str
) -> None:
    result = sendmail(node.config_path, "-i", "-f", "a@example.org", "ok@rich.test", argument,
                      message=b"Subject: x\n\nmarker-noaddr\n")  # fmt: skip
    assert result.returncode == 64, result.stderr
    # (As every text of another's: escaped, a backslash doubled, so that no "\\x0d" is ambiguous.)
    assert f"'{shown(argument)}'".encode() in result.stderr, result.stderr
    assert b"<@rich.test>" not in result.stderr
    assert not any(b"marker-noaddr" in m.data for m in sink.received)


def test_recipient_arguments_are_read_as_postfixs_sendmail_reads_them(node: PigeonProcess, sink: ScriptedSink) -> None:
    # Several in one argument, separated by commas; a name and a comment around one; a source
    # route (RFC 5321 C) dropped, as Postfix drops it; a quoted local part with its "@".
    arguments = ["l1@rich.test, l2@rich.test", "Ann <l3@rich.test>", "l4@rich.test (Bob)",
                 "@r1.test:l5@rich.test", "<@r1.test,@r2.test:l6@rich.test>", '"l7@x"@rich.test']  # fmt: skip
    result = sendmail(node.config_path, "-i", *arguments, message=b"Subject: x\n\nmarker-args\n")
    assert result.returncode == 0, result.stderr
    got = all_arrived(sink, b"marker-args", 7)
    expected = [f"l{n}@rich.test" for n in range(1, 7)] + ['"l7@x"@rich.test']
    assert sorted(r for m in got for r in m.recipients) == sorted(expected)
