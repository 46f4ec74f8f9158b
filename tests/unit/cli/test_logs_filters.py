"""`pigeon logs` filters: an operator asking what became of one recipient, one message or one
hour's bounces gets those records and no others, from every segment."""

from __future__ import annotations

import datetime
import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import zygote

HOUR = 3600.0


def _write(directory: Path, now: float) -> None:
    records = [
        {"type": "Reception", "id": "00000000000000a1", "timestamp": now - 3 * HOUR, "sender": "shop@src.test",
         "recipients": ["Bob@Example.com", "carol@example.net"]},
        {"type": "Delivery", "id": "00000000000000a1", "timestamp": now - 3 * HOUR + 1, "sender": "shop@src.test",
         "recipient": "bob@example.com"},
        {"type": "Bounce", "id": "00000000000000a1", "timestamp": now - 3 * HOUR + 2, "sender": "shop@src.test",
         "recipient": "carol@example.net"},
        {"type": "Reception", "id": "00000000000000b2", "timestamp": now - 60, "sender": "news@src.test",
         "recipients": ["bob@example.com"]},
        {"type": "TransientFailure", "id": "00000000000000b2", "timestamp": now - 30, "sender": "news@src.test",
         "recipient": "bob@example.com"},
        {"type": "Rejection", "timestamp": now - 20, "session": "s", "peer": "p", "command": "RCPT"},
    ]  # fmt: skip
    half = len(records) // 2
    (directory / "20270115-000000-000000-w0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:half]))
    (directory / "20270115-000000-000000-w1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[half:]))


def _logs(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return zygote.run(
        ["logs", "--dir", str(directory), *args],
        text=True,
        timeout=60,
    )


def _shown(directory: Path, *args: str) -> list[tuple[str, str]]:
    result = _logs(directory, *args)
    assert result.returncode == 0, result.stderr
    return [(record["type"], record.get("id", "")) for record in map(json.loads, result.stdout.splitlines())]


def test_a_recipient_filter_shows_its_receptions_and_attempts_in_any_case(tmp_path: Path) -> None:
    _write(tmp_path, time.time())
    assert _shown(tmp_path, "--recipient", "BOB@example.com") == [
        ("Reception", "00000000000000a1"),
        ("Delivery", "00000000000000a1"),
        ("Reception", "00000000000000b2"),
        ("TransientFailure", "00000000000000b2"),
    ]
    assert _shown(tmp_path, "--recipient", "<carol@example.net>", "--type", "Bounce") == [
        ("Bounce", "00000000000000a1")
    ]


def test_an_id_filter_tells_one_messages_story_and_repeated_ones_match_either(tmp_path: Path) -> None:
    _write(tmp_path, time.time())
    assert [kind for kind, _ in _shown(tmp_path, "--id", "00000000000000A1")] == ["Reception", "Delivery", "Bounce"]
    assert len(_shown(tmp_path, "--id", "00000000000000a1", "--id", "00000000000000b2")) == 5
    assert _shown(tmp_path, "--sender", "news@src.test") == [
        ("Reception", "00000000000000b2"),
        ("TransientFailure", "00000000000000b2"),
    ]


def test_an_id_filter_tells_the_story_of_the_messages_its_received_field_was_written_for(tmp_path: Path) -> None:
    # One reception for two domains: one body, whose Received: field (returned in a DSN about
    # either message) names the first id. Asked for that id, the second's bounce is told too.
    now = time.time()
    records = [
        {"type": "Reception", "id": "00000000000000c1", "timestamp": now - 9, "recipients": ["a@one.test"]},
        {"type": "Reception", "id": "00000000000000c2", "timestamp": now - 9, "recipients": ["b@two.test"],
         "trace_id": "00000000000000c1"},
        {"type": "Reception", "id": "00000000000000d1", "timestamp": now - 8, "recipients": ["c@two.test"]},
        {"type": "Delivery", "id": "00000000000000c1", "timestamp": now - 5, "recipient": "a@one.test"},
        {"type": "Bounce", "id": "00000000000000c2", "timestamp": now - 4, "recipient": "b@two.test"},
        {"type": "Bounce", "id": "00000000000000d1", "timestamp": now - 3, "recipient": "c@two.test"},
    ]  # fmt: skip
    (tmp_path / "20270115-000000-000000-w0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert _shown(tmp_path, "--id", "00000000000000C1", "--type", "Bounce") == [("Bounce", "00000000000000c2")]
    assert [i for _, i in _shown(tmp_path, "--id", "00000000000000c1")] == ["00000000000000c1", "00000000000000c2"] * 2
    assert _shown(tmp_path, "--id", "00000000000000c2") == [
        ("Reception", "00000000000000c2"),
        ("Bounce", "00000000000000c2"),
    ]


def test_an_id_filter_tells_the_story_of_the_dsn_pigeon_wrote_about_that_message(tmp_path: Path) -> None:
    # The DSN's own Reception names the message it reports on (`reports_on`): asked for the
    # bounced message, its DSN's reception and delivery are told too; asked for the DSN, only its own.
    now = time.time()
    records = [
        {"type": "Reception", "id": "00000000000000e1", "timestamp": now - 9, "recipients": ["gone@two.test"]},
        {"type": "Reception", "id": "00000000000000f1", "timestamp": now - 8, "recipients": ["x@two.test"]},
        {"type": "Bounce", "id": "00000000000000e1", "timestamp": now - 5, "recipient": "gone@two.test"},
        {"type": "Reception", "id": "00000000000000e2", "timestamp": now - 5, "sender": "",
         "recipients": ["ann@one.test"], "protocol": "LOCAL", "reports_on": "00000000000000e1"},
        {"type": "Delivery", "id": "00000000000000f1", "timestamp": now - 4, "recipient": "x@two.test"},
        {"type": "Delivery", "id": "00000000000000e2", "timestamp": now - 3, "recipient": "ann@one.test"},
    ]  # fmt: skip
    (tmp_path / "20270115-000000-000000-w0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert _shown(tmp_path, "--id", "00000000000000E1") == [
        ("Reception", "00000000000000e1"),
        ("Bounce", "00000000000000e1"),
        ("Reception", "00000000000000e2"),
        ("Delivery", "00000000000000e2"),
    ]
    assert _shown(tmp_path, "--id", "00000000000000e2") == [
        ("Reception", "00000000000000e2"),
        ("Delivery", "00000000000000e2"),
    ]


@pytest.mark.parametrize("since", ["5m", "300s", "@"])
def test_since_takes_a_time_ago_an_iso_time_or_a_unix_timestamp(tmp_path: Path, since: str) -> None:
    now = time.time()
    _write(tmp_path, now)
    if since == "@":
        since = str(now - 300)
    assert [kind for kind, _ in _shown(tmp_path, "--since", since)] == ["Reception", "TransientFailure", "Rejection"]
    local = datetime.datetime.fromtimestamp(now - 2 * HOUR).isoformat(timespec="seconds")
    assert len(_shown(tmp_path, "--since", local)) == 3
    utc = datetime.datetime.fromtimestamp(now - 2 * HOUR, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert len(_shown(tmp_path, "--since", utc)) == 3
    assert [kind for kind, _ in _shown(tmp_path, "--until", "1h")] == ["Reception", "Delivery", "Bounce"]


def test_since_reads_no_segment_its_writer_closed_before_then(tmp_path: Path) -> None:
    # Found from outside: `--since 2m` read every segment, 0.7 s with 10 MB of log, 4.5 s with
    # 44 MB, growing with every day kept. A segment whose successor began before --since holds
    # nothing newer (written before the next began): it is not read. This one, made up to tell,
    # holds a record stamped later, which only a reading of it would print.
    now = time.time()

    def segment(started: float, *records: dict[str, object]) -> None:
        name = time.strftime("%Y%m%d-%H%M%S", time.gmtime(started)) + "-000000-w0.jsonl"
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in records))

    segment(now - 3 * HOUR, {"type": "Rejection", "timestamp": now - 10, "command": "RCPT"})
    segment(now - 2 * HOUR, {"type": "Delivery", "id": "00000000000000a1", "timestamp": now - 80 * 60})
    segment(now - HOUR, {"type": "Bounce", "id": "00000000000000a1", "timestamp": now - 300})
    assert [kind for kind, _ in _shown(tmp_path, "--since", "90m")] == ["Delivery", "Bounce"]
    assert [kind for kind, _ in _shown(tmp_path, "--since", "30m")] == ["Bounce"]
    assert "Rejection" in [kind for kind, _ in _shown(tmp_path)]  # read when no --since says otherwise


@pytest.mark.parametrize("since", ["10:30", "10:30:00", "T10:30"])
def test_since_and_until_take_a_time_of_day_as_todays(tmp_path: Path, since: str) -> None:
    noon = datetime.datetime.combine(datetime.date.today(), datetime.time(12)).timestamp()
    _write(tmp_path, noon)  # receptions at 09:00 and 11:59 today, local time
    assert [kind for kind, _ in _shown(tmp_path, "--since", since)] == ["Reception", "TransientFailure", "Rejection"]
    assert [kind for kind, _ in _shown(tmp_path, "--until", since)] == ["Reception", "Delivery", "Bounce"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--since", "yesterday-ish"], "'yesterday-ish' is no time"),
        (["--since", "nan"], "'nan' is no time"),
        (["--until=-inf"], "'-inf' is no time"),
        (["--until", "1h", "--follow"], "--until ends what --follow would keep printing"),
    ],
)
def test_a_time_it_cannot_read_is_a_usage_error(tmp_path: Path, args: list[str], said: str) -> None:
    _write(tmp_path, time.time())
    result = _logs(tmp_path, *args)
    assert result.returncode == 2 and result.stdout == ""
    assert said in result.stderr


@pytest.mark.parametrize(("since", "until"), [("2h", "3h"), ("1h", "1h"), ("2027-01-15T10:00", "2027-01-15T09:00")])
def test_an_until_not_after_since_is_a_usage_error_not_an_empty_answer(tmp_path: Path, since: str, until: str) -> None:
    # "--since 2h --until 3h" (3 hours ago is before 2 hours ago) printed nothing and exited 0:
    # read as "no such records", when no record could ever be between them.
    _write(tmp_path, time.time())
    result = _logs(tmp_path, "--since", since, "--until", until)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"pigeon: --until {until!r} (")
    assert f"is not after --since {since!r} (" in result.stderr and "no record is between them" in result.stderr


def test_an_unknown_classification_is_a_usage_error_listing_the_known_ones(tmp_path: Path) -> None:
    # "--classification nosuchclass" printed nothing and exited 0, as if no mail had that class.
    _write(tmp_path, time.time())
    result = _logs(tmp_path, "--classification", "QuotaIssues", "--classification", "nosuchclass")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("pigeon: no bounce class 'nosuchclass'; the classes are ")
    assert all(name in result.stderr for name in ("QuotaIssues", "PolicyRelated", "BadConnection", "Uncategorized"))
    assert _logs(tmp_path, "--classification", "quotaissues").returncode == 0  # (in any case, as before)


def test_a_classification_of_the_configured_rule_files_is_known(tmp_path: Path) -> None:
    # A class a `[delivery] bounce_rules` file gives is in the records as the built-in ones are.
    (tmp_path / "log").mkdir()
    (tmp_path / "rules.toml").write_text('[[rule]]\nclass = "GreylistedHere"\npattern = "greylist"\n')
    (tmp_path / "pigeon.toml").write_text('[log]\npath = "log"\n[delivery]\nbounce_rules = ["rules.toml"]\n')
    _write_records(tmp_path / "log", [
        {"type": "TransientFailure", "id": "00000000000000c3", "timestamp": time.time(), "sender": "a@src.test",
         "recipient": "b@example.com", "classification": "GreylistedHere"},
    ])  # fmt: skip
    result = zygote.run(
        [
            "logs",
            "-c",
            str(tmp_path / "pigeon.toml"),
            "--classification",
            "greylistedhere",
        ],
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == ["00000000000000c3"]
    refused = _logs(tmp_path / "log", "--classification", "GreylistedHere")  # (--dir alone: no rule files)
    assert refused.returncode == 2 and "give -c" in refused.stderr


def _write_records(directory: Path, records: list[dict[str, object]]) -> None:
    (directory / "20270115-000000-000000-w0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_an_address_filter_finds_a_domain_logged_as_its_a_label_or_its_u_label_whichever_is_given(
    tmp_path: Path,
) -> None:
    # Found from outside: `--recipient idnq1@bücher.example` did not find mail logged for
    # idnq1@xn--bcher-kva.example, nor the other way round, though they are one domain.
    now = time.time()
    _write_records(
        tmp_path,
        [
            {"type": "Reception", "id": "00000000000000d1", "timestamp": now - 9, "sender": "Jörg@Bücher.example",
             "recipients": ["idnq1@xn--bcher-kva.example"]},
            {"type": "Delivery", "id": "00000000000000d1", "timestamp": now - 8, "sender": "Jörg@Bücher.example",
             "recipient": "idnq1@xn--bcher-kva.example"},
            {"type": "Reception", "id": "00000000000000d2", "timestamp": now - 7, "sender": "j@xn--bcher-kva.example",
             "recipients": ["IDNQ2@BÜCHER.example"]},
            {"type": "Reception", "id": "00000000000000d3", "timestamp": now - 6, "sender": "j@other.example",
             "recipients": ["idnq1@other.example"]},
        ],
    )  # fmt: skip
    assert _shown(tmp_path, "--recipient", "idnq1@bücher.example") == [
        ("Reception", "00000000000000d1"),
        ("Delivery", "00000000000000d1"),
    ]
    assert _shown(tmp_path, "--recipient", "idnq2@xn--bcher-kva.example") == [("Reception", "00000000000000d2")]
    assert _shown(tmp_path, "--recipient", "IDNQ1@XN--BCHER-KVA.EXAMPLE") == _shown(
        tmp_path, "--recipient", "idnq1@bücher.example"
    )
    assert _shown(tmp_path, "--sender", "jörg@xn--bcher-kva.example") == [
        ("Reception", "00000000000000d1"),
        ("Delivery", "00000000000000d1"),
    ]
    assert _shown(tmp_path, "--sender", "J@bücher.example") == [("Reception", "00000000000000d2")]


def test_the_null_sender_filter_matches_only_records_whose_sender_is_the_null_sender(tmp_path: Path) -> None:
    # Found from outside: `--sender ''` matched every record without a sender (a request refused
    # whole, a connection refused before MAIL), which are not the null sender's.
    now = time.time()
    _write_records(
        tmp_path,
        [
            {"type": "Reception", "id": "00000000000000e1", "timestamp": now - 9, "sender": "",
             "recipients": ["a@example.com"]},
            {"type": "Bounce", "id": "00000000000000e1", "timestamp": now - 8, "sender": "",
             "recipient": "a@example.com"},
            {"type": "Rejection", "timestamp": now - 7, "session": "s1", "peer": "p", "command": "inject"},
            {"type": "Rejection", "timestamp": now - 6, "session": "s2", "peer": "p", "command": "EHLO"},
            {"type": "Reception", "id": "00000000000000e2", "timestamp": now - 5, "sender": "b@example.com",
             "recipients": ["a@example.com"]},
        ],
    )  # fmt: skip
    assert _shown(tmp_path, "--sender", "") == [("Reception", "00000000000000e1"), ("Bounce", "00000000000000e1")]
    assert _shown(tmp_path, "--sender", "<>") == _shown(tmp_path, "--sender", "")


def test_the_help_and_the_readme_say_records_come_in_the_order_written_not_sorted_by_time() -> None:
    # Found from outside: the help said "oldest first ... by time", but a worker writes its
    # records in commit order, whose timestamps step back by up to ~0.2 s.
    from pigeon.cli.logs import EXAMPLES

    assert "oldest first" not in EXAMPLES and "in the order written" in EXAMPLES
    assert "Nothing is sorted" in EXAMPLES
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    assert "prints all of them in\norder" not in readme
    assert "`timestamp` may step back by a fraction of a second" in readme


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--recipient", "bounce.test"], "--recipient 'bounce.test' is not an address (local@domain)"),
        (["--recipient", "@bounce.test"], "give --domain bounce.test"),
        (["--recipient", "not an address"], "is not an address (local@domain)"),
        (["--recipient", ""], "is not an address (local@domain)"),
        (["--sender", "shop"], "--sender 'shop' is not an address (local@domain, or '' for the null sender)"),
        (["--id", "xyz"], "--id 'xyz' is not a message id: an id is 16 hex digits"),
        (["--id", "0000018c2f0a1b2c0"], "is not a message id"),
        (["--domain", "@bounce.test"], "--domain '@bounce.test' is not a domain: give it alone, --domain bounce.test"),
        (["--domain", "bob@bounce.test"], "give --recipient bob@bounce.test"),
        (["--domain", "*.bounce.test"], "is not a domain (example.com, or an address literal [192.0.2.1]; no globs)"),
        (["--domain", ""], "is not a domain"),
    ],
)
def test_a_filter_value_that_could_never_match_is_a_usage_error_saying_the_form(
    tmp_path: Path, args: list[str], said: str
) -> None:
    # Found from outside: `--recipient bounce.test`, `--recipient @bounce.test`, `--id xyz`
    # printed nothing and exited 0, which reads as "no such mail", for ever.
    _write(tmp_path, time.time())
    result = _logs(tmp_path, *args)
    assert result.returncode == 2 and result.stdout == ""
    assert said in result.stderr, result.stderr


def test_the_forms_every_door_takes_are_still_taken(tmp_path: Path) -> None:
    _write(tmp_path, time.time())
    for args in (
        ["--recipient", "Postmaster"],
        ["--recipient", '"a b"@example.com'],
        ["--sender", "<>"],
        ["--recipient", " <bob@example.com> "],
        ["--domain", "[127.0.0.1]"],
        ["--domain", "bücher.example"],
    ):
        result = _logs(tmp_path, *args)
        assert result.returncode == 0, (args, result.stderr)


def test_a_domain_filter_finds_every_recipients_records_at_that_domain(tmp_path: Path) -> None:
    # "Everything for this domain": the recipients' domain, in any case and label form; not
    # the sender's (as `pigeon bounce --domain` selects mail by its recipients' domain).
    now = time.time()
    _write_records(
        tmp_path,
        [
            {"type": "Reception", "id": "00000000000000f1", "timestamp": now - 9, "sender": "a@bounce.test",
             "recipients": ["x@Bounce.Test", "y@other.test"]},
            {"type": "Bounce", "id": "00000000000000f1", "timestamp": now - 8, "sender": "a@bounce.test",
             "recipient": "x@Bounce.Test"},
            {"type": "Delivery", "id": "00000000000000f1", "timestamp": now - 8, "sender": "a@bounce.test",
             "recipient": "y@other.test"},
            {"type": "Reception", "id": "00000000000000f2", "timestamp": now - 7, "sender": "b@bounce.test",
             "recipients": ["z@sub.bounce.test"]},
            {"type": "Rejection", "timestamp": now - 6, "session": "s", "command": "RCPT",
             "recipients": ["q@bounce.test"]},
            {"type": "Reception", "id": "00000000000000f3", "timestamp": now - 5,
             "recipients": ["u@xn--bcher-kva.example"]},
        ],
    )  # fmt: skip
    assert _shown(tmp_path, "--domain", "BOUNCE.test") == [
        ("Reception", "00000000000000f1"),
        ("Bounce", "00000000000000f1"),
        ("Rejection", ""),
    ]
    assert _shown(tmp_path, "--domain", "bounce.test", "--type", "Bounce") == [("Bounce", "00000000000000f1")]
    assert _shown(tmp_path, "--domain", "bücher.example") == [("Reception", "00000000000000f3")]
    assert len(_shown(tmp_path, "--domain", "sub.bounce.test", "--domain", "other.test")) == 3


def test_the_help_and_the_readme_describe_the_domain_filter() -> None:
    from pigeon.cli.logs import EXAMPLES

    assert "--domain" in EXAMPLES
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    assert "`--domain DOMAIN` (the recipients' domain" in readme


def test_a_directory_without_an_event_log_is_said_to_hold_none(tmp_path: Path) -> None:
    # `pigeon logs --dir /etc` printed nothing and exited 0, as for a log without such mail.
    (tmp_path / "pigeon.toml").write_text("")
    shown = _logs(tmp_path)
    assert (shown.returncode, shown.stdout) == (0, "")
    assert f"--dir {tmp_path} holds no event log (no *.jsonl segment): nothing to show" in shown.stderr
    _write(tmp_path, time.time())
    assert "holds no event log" not in _logs(tmp_path).stderr
