"""The `pigeon` command as an operator meets it."""

from __future__ import annotations

import json
import os
import re
import smtplib
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.services import RedisServer
from tests.support.sinks import ScriptedSink, delivery_config, wait_until


def pigeon_cli(*args: str, cwd: Path | None = None, columns: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)} if columns else None
    return zygote.run([*args], text=True, cwd=cwd, timeout=60, env=env)


def test_logs_prints_every_record_from_plain_and_compressed_segments(tmp_path: Path) -> None:
    root = tmp_path / "node"
    for run in range(2):  # the first run's segment is compressed when it stops
        with PigeonProcess(root) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail(
                "a@example.org", [f"run{run}@example.net"], b"From: a@example.org\r\nSubject: x\r\n\r\nbody\r\n"
            )
            client.docmd("BOGUS")
    assert list((root / "log").glob("*.jsonl.gz"))
    result = pigeon_cli("logs", "-c", str(root / "pigeon.toml"))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["type"] for r in records] == ["Reception", "Rejection", "Reception", "Rejection"]
    assert [r["recipients"] for r in records if r["type"] == "Reception"] == [
        ["run0@example.net"],
        ["run1@example.net"],
    ]
    only = pigeon_cli("logs", "-c", str(root / "pigeon.toml"), "--type", "Rejection")
    assert [json.loads(line)["command"] for line in only.stdout.splitlines()] == ["BOGUS", "BOGUS"]


def test_a_wrong_key_stops_start_up_naming_the_file_line_and_key(tmp_path: Path) -> None:
    config = tmp_path / "pigeon.toml"
    config.write_text('[smtp]\nlisten = ["127.0.0.1:2525"]\nmax_mesage_size = "10MB"\n')
    result = pigeon_cli("serve", "-c", str(config))
    assert result.returncode == 2
    assert f"{config}, line 3: [smtp] max_mesage_size: unknown key" in result.stderr


def test_a_wrong_value_names_the_key(tmp_path: Path) -> None:
    config = tmp_path / "pigeon.toml"
    config.write_text('[smtp]\nidle_timeout = "forever"\n')
    result = pigeon_cli("serve", "-c", str(config))
    assert result.returncode == 2
    assert "line 2: [smtp] idle_timeout: 'forever' is not a duration" in result.stderr


def test_a_hostname_that_cannot_go_on_the_wire_stops_start_up_and_fails_the_check(tmp_path: Path) -> None:
    # It used to start: every SMTP connection then failed in its banner, and SIGTERM crashed.
    config = tmp_path / "pigeon.toml"
    config.write_text(
        '[smtp]\nlisten = ["127.0.0.1:0"]\nhostname = "evil.test\\r\\nX-Injected: yes"\n\n'
        '[http]\nlisten = "127.0.0.1:0"\n'
    )
    result = pigeon_cli("serve", "-c", str(config))
    assert result.returncode == 2
    message = f"{config}, line 3: [smtp] hostname: 'evil.test\\r\\nX-Injected: yes' holds white space or a control"
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    checked = pigeon_cli("shaping", "check", str(config))  # it used to say "OK"
    assert checked.returncode == 1 and message in checked.stdout + checked.stderr


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("127.0.0.1:27500/json", "no http:// or https:// at the start"),
        ("ftp://x", "scheme 'ftp' is not http or https"),
        ("http:///inbound", "no host"),
    ],
    ids=["no-scheme", "ftp", "no-host"],
)
def test_a_webhook_url_that_is_not_http_stops_start_up_naming_the_file_line_and_key(
    tmp_path: Path, url: str, why: str
) -> None:
    # It used to load, and every handoff then failed "for now" until max_age.
    config = tmp_path / "pigeon.toml"
    config.write_text(
        '[[target]]\nname = "ok"\nkind = "webhook"\nurl = "http://127.0.0.1:9/in"\n\n'
        f'[[target]]\nname = "hook"\nkind = "webhook"\nurl = "{url}"\n\n'
        '[smtp]\nlisten = ["127.0.0.1:0"]\n\n[http]\nlisten = "127.0.0.1:0"\n'  # (should it start after all)
    )
    result = pigeon_cli("serve", "-c", str(config))
    assert result.returncode == 2
    expected = 'expected an http:// or https:// URL with a host, like "https://app.example/inbound"'
    message = f"{config}, line 9: [[target]] #2 url: target 'hook': {why}; {expected}"
    assert message in result.stderr
    assert url not in result.stderr  # (a URL may hold a password: the error names the key and line)
    assert "Traceback" not in result.stderr
    checked = pigeon_cli("shaping", "check", str(config))  # the command that checks a file
    assert checked.returncode == 1 and message in checked.stdout + checked.stderr


def test_help_shows_examples() -> None:
    for command in (
        "serve",
        "logs",
        "passwd",
        "inject",
        "bounce",
        "suspend",
        "resume",
        "retry",
        "rebind",
        "inspect",
        "top",
    ):
        result = pigeon_cli(command, "--help")
        assert result.returncode == 0
        assert "examples:" in result.stdout


def test_serve_with_no_config_runs_on_the_defaults(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "pigeon", "serve"], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline_lines = []
        assert process.stderr is not None
        for line in process.stderr:
            deadline_lines.append(line)
            if "http listening on 127.0.0.1:8025" in line or "workers ready" in line:
                break
        with smtplib.SMTP("127.0.0.1", 2525) as client:
            # An address literal: delivery (on by default) goes to 127.0.0.1:25, no DNS.
            assert (
                client.sendmail(
                    "a@example.org", ["b@[127.0.0.1]"], b"From: a@example.org\r\nSubject: defaults\r\n\r\nhi\r\n"
                )
                == {}
            )
    finally:
        process.terminate()
        process.wait(30)
    assert (tmp_path / "var" / "spool" / "shard-0" / "spool.db").exists()
    assert list((tmp_path / "var" / "log").iterdir())


def test_inject_header_to_may_be_a_group_and_the_envelope_stays_the_to_options(tmp_path: Path) -> None:
    # Found from outside: --header "To=undisclosed-recipients:;" was refused (400, exit 2).
    with ScriptedSink() as sink, PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon:
        result = pigeon_cli("inject", "-c", str(pigeon.config_path), "--from", "me@example.org",
                            "--to", "a@example.net", "--to", "b@example.net", "--subject", "bulk", "--text", "hi",
                            "--header", "To=undisclosed-recipients:;")  # fmt: skip
        assert result.returncode == 0, result.stderr
        received = sink.wait_for(2)
    assert sorted(r for m in received for r in m.recipients) == ["a@example.net", "b@example.net"]
    assert all(b"\r\nTo: undisclosed-recipients:;\r\n" in m.data for m in received)


def test_inject_sends_a_file_and_built_parts_with_the_local_token(tmp_path: Path) -> None:
    with ScriptedSink() as sink, PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon:
        config = str(pigeon.config_path)
        message = tmp_path / "message.eml"
        message.write_text("From: a@example.org\nSubject: from a file\n\nHello {{ who }}.\n")
        result = pigeon_cli("inject", "-c", config, "--from", "me@example.org", "--to", "a@example.net",
                            "--template", "--var", "who=world", str(message))  # fmt: skip
        assert result.returncode == 0, result.stderr
        spool_id = result.stdout.split()[1]
        attachment = tmp_path / "notes.txt"
        attachment.write_text("attached text: café\n")  # UTF-8: sent with charset=utf-8, not mojibake
        result = pigeon_cli("inject", "-c", config, "--from", "me@example.org", "--to", "b@example.net",
                            "--subject", "built", "--text", "body", "--attach", str(attachment), "--json")  # fmt: skip
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)
        assert answer["accepted"] == 1
        received = {m.recipients[0]: m.email for m in sink.wait_for(2)}
        assert received["a@example.net"]["Subject"] == "from a file"
        assert received["a@example.net"].get_content().strip() == "Hello world."
        assert "by mx.pigeon.test (Pigeon) with HTTP id " + spool_id in received["a@example.net"]["Received"]
        (part,) = list(received["b@example.net"].iter_attachments())
        assert (part.get_filename(), part.get_content()) == ("notes.txt", "attached text: café\n")
        assert part.get_param("charset") == "utf-8"
        controlled = tmp_path / "a\tb.txt"  # a control character in a file name: the request's 400
        controlled.write_text("x")
        refused = pigeon_cli("inject", "-c", config, "--from", "me@example.org", "--to", "b@example.net",
                             "--text", "body", "--attach", str(controlled))  # fmt: skip
        assert refused.returncode == 2 and "$.content.attachments[0].file_name" in refused.stderr, refused.stderr
        refused = pigeon_cli("inject", "-c", config, "--from", "me@example.org", "--to", "bad address", str(message))
        assert refused.returncode == 2
        assert "recipients[0].email" in refused.stderr
        smuggling = pigeon_cli("inject", "-c", config, "--from", "me@example.org", "--to", "a@example.net",
                               "--tenant", "acme\n.\r\nMAIL FROM:<ceo@bank.example>", str(message))  # fmt: skip
        assert smuggling.returncode == 2
        assert "$.tenant" in smuggling.stderr and "must not contain a CR" in smuggling.stderr
        wrong = pigeon_cli("inject", "-c", config, "--token", "x" * 20, "--from", "a@example.org", "--to",
                           "b@example.net", str(message))  # fmt: skip
        assert wrong.returncode == 77 and "401: unknown token" in wrong.stderr  # EX_NOPERM


def test_inject_reads_a_piped_message_without_a_dash_as_sendmail_does(tmp_path: Path) -> None:
    """`... | pigeon inject --from A --to B`, as an MTA or a script pipes mail to sendmail; on
    a terminal the same command is a usage error, not a wait for typed mail."""
    with ScriptedSink() as sink, PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon:
        command = ["inject", "-c", str(pigeon.config_path), "--from", "me@example.org", "--to", "a@example.net"]
        piped = zygote.run(command, input="From: me@example.org\nSubject: piped\n\nHello.\n", text=True)
        assert piped.returncode == 0, piped.stderr
        (received,) = sink.wait_for(1)
        assert received.email["Subject"] == "piped"
        terminal, other_end = os.openpty()
        try:
            at_a_terminal = [sys.executable, "-m", "pigeon", *command]  # (the zygote's stdin is no terminal)
            typed = subprocess.run(at_a_terminal, stdin=terminal, capture_output=True, text=True, timeout=60)
        finally:
            os.close(terminal)
            os.close(other_end)
        assert typed.returncode == 2
        assert typed.stderr == (
            "pigeon inject: give either a message file (or -, or pipe it on stdin) or parts (--subject, --text, "
            "--html, --attach)\n"
        )


def _deferred_once(pigeon: PigeonProcess) -> dict[str, Any]:
    """One message, to an address the sink refuses for now, once its first attempt failed."""
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.sendmail("a@example.org", ["tempfail@example.net"], b"From: a@example.org\r\nSubject: x\r\n\r\nhi\r\n")
    (message,) = pigeon.spool_messages()
    wait_until(lambda: pigeon.records("TransientFailure"))
    return message


def test_admin_commands_bounce_suspend_resume_retry_and_inspect(tmp_path: Path) -> None:
    with (
        ScriptedSink() as sink,
        PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint, retry_interval="1h")) as pigeon,
    ):
        config = ["-c", str(pigeon.config_path)]
        message = _deferred_once(pigeon)
        shown = pigeon_cli("inspect", *config, message["id"])
        assert shown.returncode == 0, shown.stderr
        assert "attempts       1" in shown.stdout and "451 4.3.0" in shown.stdout
        retried = pigeon_cli("retry", *config, "--domain", "example.net")
        assert (retried.returncode, retried.stdout.strip()) == (0, "1 message due now")
        suspended = pigeon_cli("suspend", *config, "--tenant", "acme", "--json")
        rule_id = json.loads(suspended.stdout)["rule"]["id"]
        listed = pigeon_cli("suspend", *config, "--list")
        assert listed.stdout.startswith(rule_id) and "tenant=acme" in listed.stdout
        assert listed.stdout.splitlines()[0].endswith(" by local via cli"), listed.stdout  # no reason: no colon
        assert pigeon_cli("resume", *config, rule_id).stdout.strip() == "resumed: 0 messages due now"
        bounced = pigeon_cli("bounce", *config, "--domain", "example.net", "--reason", "cli test")
        assert (bounced.returncode, bounced.stdout.strip()) == (0, "bounced 1 message")
        operations = pigeon_cli("queue", "operations", *config)
        (row,) = [line for line in operations.stdout.splitlines()[1:] if " bounce " in line]
        assert row.split()[2:7] == ["1", "1", "0", "0", "done"]  # looked at, acted on, after attempt, waited, done
        (record,) = pigeon.wait_records("AdminBounce")
        assert (record["id"], record["reason"], record["operator"]) == (message["id"], "cli test", "local")
        missing = pigeon_cli("inspect", *config, message["id"])
        assert missing.returncode == 2 and "404" in missing.stderr
        empty = pigeon_cli("bounce", *config, "--reason", "no selector")
        assert empty.returncode == 2 and "at least one of" in empty.stderr
        for command in ("bounce", "suspend"):  # --cluster is for --list: refused, not ignored
            misplaced = pigeon_cli(command, *config, "--domain", "example.net", "--cluster")
            assert misplaced.returncode == 2 and "--cluster goes with --list" in misplaced.stderr
        assert pigeon_cli("suspend", *config, "--list").stdout.strip() == "none"  # nothing was suspended
        standing = json.loads(pigeon_cli("bounce", *config, "--domain", "x.test", "--duration", "1h", "--json").stdout)
        cancelled = pigeon_cli("bounce", *config, "--cancel", standing["rule"]["id"])
        assert (cancelled.returncode, cancelled.stdout.strip()) == (
            0,
            f"cancelled standing bounce {standing['rule']['id']}",
        )


def test_suspend_list_says_a_suspension_without_a_duration_lasts_until_resumed(tmp_path: Path) -> None:
    # It said "until cancelled", but `pigeon resume` is what ends one (`bounce --cancel` ends a bounce).
    with PigeonProcess(tmp_path / "node", delivery={"enabled": True}) as pigeon:
        config = ["-c", str(pigeon.config_path)]
        assert pigeon_cli("suspend", *config, "--tenant", "acme").returncode == 0
        assert pigeon_cli("suspend", *config, "--tenant", "zed", "--duration", "1h").returncode == 0
        listed = pigeon_cli("suspend", *config, "--list")
        assert listed.returncode == 0, listed.stderr
        rows = {line.split()[1]: line for line in listed.stdout.splitlines()}
        assert " until resumed " in rows["tenant=acme"] and "cancelled" not in listed.stdout, listed.stdout
        assert " UTC " in rows["tenant=zed"] and "until" not in rows["tenant=zed"], listed.stdout  # its end


def test_inspect_shows_a_remote_reply_with_terminal_controls_escaped(tmp_path: Path) -> None:
    # A remote MX chooses its reply text: OSC and CSI sequences in it must not retitle or clear
    # the operator's terminal when `pigeon inspect` shows it as the last response.
    with (
        ScriptedSink() as sink,
        PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint, retry_interval="1h")) as pigeon,
    ):
        sink.rcpt_reply = lambda address: "451 4.7.1 later \x1b]0;pwned\x07\x1b[2J cleared"
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["b@example.net"], b"From: a@example.org\r\nSubject: x\r\n\r\nhi\r\n")
        (message,) = pigeon.spool_messages()
        wait_until(lambda: pigeon.records("TransientFailure"))
        shown = pigeon_cli("inspect", "-c", str(pigeon.config_path), message["id"])
        assert shown.returncode == 0, shown.stderr
        assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
        assert "last_response  451 4.7.1 later \\x1b]0;pwned\\x07\\x1b[2J cleared\n" in shown.stdout
        raw = json.loads(pigeon_cli("inspect", "-c", str(pigeon.config_path), message["id"], "--json").stdout)
        assert raw["last_response"] == "451 4.7.1 later \x1b]0;pwned\x07\x1b[2J cleared"  # as it was, for scripts


def test_inspect_shows_the_routing_domain_a_rebind_gave_in_text_and_json(tmp_path: Path) -> None:
    # Found from outside: delivery routed the mail as `--routing-domain`, but `pigeon inspect`
    # (text and --json) did not show it.
    with (
        ScriptedSink() as sink,
        PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint, retry_interval="1h")) as pigeon,
    ):
        config = ["-c", str(pigeon.config_path)]
        message = _deferred_once(pigeon)
        before = pigeon_cli("inspect", *config, message["id"])
        assert before.returncode == 0 and "routing_domain" not in before.stdout, before.stdout + before.stderr
        assert json.loads(pigeon_cli("inspect", *config, message["id"], "--json").stdout)["routing_domain"] is None
        rebound = pigeon_cli("rebind", *config, "--domain", "example.net", "--routing-domain", "relay.example")
        assert rebound.returncode == 0, rebound.stderr
        wait_until(lambda: len(pigeon.records("TransientFailure")) == 2)  # tried again, routed as relay.example
        shown = pigeon_cli("inspect", *config, message["id"])
        assert shown.returncode == 0, shown.stderr
        assert "routing_domain relay.example\n" in shown.stdout
        assert "recipients     tempfail@example.net\n" in shown.stdout
        raw = json.loads(pigeon_cli("inspect", *config, message["id"], "--json").stdout)
        assert raw["routing_domain"] == "relay.example"


def test_queue_summary_prints_a_table(tmp_path: Path) -> None:
    with (
        ScriptedSink() as sink,
        PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint, retry_interval="1h")) as pigeon,
    ):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            for _ in range(3):
                client.sendmail(
                    "a@example.org", ["tempfail@example.net"], b"From: a@example.org\r\nX-Campaign: c1\r\n\r\nhi\r\n"
                )
        wait_until(lambda: len(pigeon.records("TransientFailure")) == 3)
        result = pigeon_cli("queue", "summary", "-c", str(pigeon.config_path))
        assert result.returncode == 0, result.stderr
        (row,) = [line for line in result.stdout.splitlines() if line.startswith("c1:@example.net")]
        messages, due, later, upcoming, held = row.split()[1:6]
        # Each waits for its retry in about an hour (jittered): "later", the first one due "next".
        assert (messages, due, later, held) == ("3", "0", "3", "0"), result.stdout
        assert re.fullmatch(r"1\.[01]h|[45]\d\.\dm|60\.0m", upcoming), result.stdout
        listed = json.loads(pigeon_cli("queue", "summary", "--json", "-c", str(pigeon.config_path)).stdout)
        (counted,) = [q for q in listed["scheduled"] if q["queue"] == "c1:@example.net"]
        assert counted["later"] == 3 and 2700 < counted["next_due"] - time.time() < 4500, counted
        campaign = "spring-sale-2026-second-reminder-for-dormant-customers"
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail(
                "a@example.org",
                ["tempfail@example.net"],
                f"From: a@example.org\r\nX-Campaign: {campaign}\r\n\r\nhi\r\n",
            )
        wait_until(lambda: len(pigeon.records("TransientFailure")) == 4)
        result = pigeon_cli("queue", "summary", "-c", str(pigeon.config_path))
        lines = result.stdout.splitlines()
        (row,) = [line for line in lines if line.startswith(campaign)]
        assert row.split()[0] == f"{campaign}:@example.net"  # whole, to paste into --queue
        # --cluster of a node without [redis]: its own answer, and it says so.
        alone = "this node only: it has no [redis] url, so there is no cluster to ask"
        cluster = pigeon_cli("queue", "summary", "--cluster", "-c", str(pigeon.config_path))
        assert cluster.returncode == 0 and cluster.stdout.splitlines()[-1] == f"note: {alone}", cluster.stdout
        top = pigeon_cli("top", "--once", "--cluster", "-c", str(pigeon.config_path))
        assert f"cluster: {alone}" in top.stdout.splitlines(), top.stdout
        assert row.index(" 1 ") + 2 == lines[0].index("messages") + len("messages")  # still under its heading


def test_top_shows_rates_queues_and_connections(tmp_path: Path) -> None:
    with (
        ScriptedSink() as sink,
        PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint, retry_interval="1h")) as pigeon,
    ):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail(
                "a@example.org", ["tempfail@example.net"], b"From: a@example.org\r\nSubject: x\r\n\r\nhi\r\n"
            )
        wait_until(lambda: pigeon.records("TransientFailure"))
        frame = pigeon_cli("top", "-c", str(pigeon.config_path), "--once")
        assert frame.returncode == 0, frame.stderr
        lines = frame.stdout.splitlines()
        assert lines[0].startswith("pigeon top  http://127.0.0.1:")
        assert "received " in lines[1] and "delivered " in lines[1]
        assert lines[2].startswith("spool 1 message ")
        (row,) = [line for line in lines if line.startswith("example.net")]
        assert row.split()[1] == "1"
        # --json: the same frame, as one JSON document for a script.
        shown = pigeon_cli("top", "-c", str(pigeon.config_path), "--once", "--json")
        assert shown.returncode == 0, shown.stderr
        frame = json.loads(shown.stdout)
        assert frame["url"] == f"http://127.0.0.1:{pigeon.http_port}"
        assert set(frame["rates"]) >= {"received", "delivered", "deferred", "bounced"}
        assert frame["spool_messages"] == 1
        assert frame["smtp_connections"] == {"in": 0, "out": 0}
        (queue,) = [q for q in frame["queues"]["scheduled"] if q["queue"] == "example.net"]
        assert queue["messages"] == 1
        assert "inbound" not in frame and "cluster" not in frame


def test_top_of_a_node_with_redis_and_delivery_off_says_why_it_shows_no_queues(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The queues' API answers 503 for the cluster on a node that only receives (it is not in the
    cluster's admin stream): `top --cluster` says so, not that the node has no [redis] url (it has one)."""
    with PigeonProcess(tmp_path / "node", redis={"url": redis_server.url}) as pigeon:
        top = pigeon_cli("top", "--once", "--cluster", "-c", str(pigeon.config_path), columns=200)
        assert top.returncode == 0, top.stderr
        reason = (
            "delivery is disabled on this node ([delivery] enabled = false): it answers for its own spool only, "
            "not for the cluster (leave out ?cluster=1)"
        )
        lines = top.stdout.splitlines()
        assert f"cluster: this node only: {reason}" in lines, top.stdout
        assert f"no queues: {reason}" in lines, top.stdout
        assert "[redis] url" not in top.stdout.replace(reason, "")
        shown = pigeon_cli("top", "--once", "--cluster", "--json", "-c", str(pigeon.config_path))
        frame = json.loads(shown.stdout)
        assert frame["cluster"] == {"nodes": {}, "error": f"this node only: {reason}"}
        assert frame["queues"] == {"scheduled": [], "ready": [], "error": reason}


def test_commands_other_than_serve_start_without_loading_the_node_or_aiohttp() -> None:
    """`pigeon queue summary`, `pigeon logs` and the rest start in a fraction of a second: the
    node (a second of imports on a small machine) and aiohttp load only for what needs them."""
    probe = "import sys, pigeon.cli.main; print(sorted(m for m in ('pigeon.node.node', 'aiohttp') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_queue_summary_names_who_suspended_a_queue_and_a_bad_duration_exits_2(tmp_path: Path) -> None:
    with (
        ScriptedSink() as sink,
        PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint, retry_interval="1h")) as pigeon,
    ):
        config = ["-c", str(pigeon.config_path)]
        for duration in ("0", "99999999d", str(10**30)):
            refused = pigeon_cli("suspend", *config, "--tenant", "acme", "--duration", duration)
            assert refused.returncode == 2, refused.stdout
            assert "duration is more than 0 and at most 365 days" in refused.stderr
            assert refused.stderr.rstrip().endswith("($.duration)"), refused.stderr
        assert pigeon_cli("suspend", *config, "--list").stdout.strip() == "none"  # nothing was suspended
        suspended = pigeon_cli("suspend", *config, "--tenant", "acme", "--reason", "bad list", "--json")
        rule_id = json.loads(suspended.stdout)["rule"]["id"]
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["ok@example.net"], b"From: a@example.org\r\nX-Tenant: acme\r\n\r\nhi\r\n")
            client.sendmail("a@example.org", ["tempfail@example.net"], b"\r\nhi\r\n")
        wait_until(lambda: pigeon.records("TransientFailure"))
        summary = pigeon_cli("queue", "summary", *config)
        assert summary.returncode == 0, summary.stderr
        lines = summary.stdout.splitlines()
        assert lines[0].split()[-3:] == ["oldest", "suspended", "by"]
        (held,) = [line for line in lines if line.startswith("acme@example.net ")]
        assert held.endswith(f"local via cli: bad list (rule {rule_id})"), held  # the token's name, the command
        (other,) = [line for line in lines if line.startswith("example.net ")]
        assert other.endswith(" -")
        rebind = pigeon_cli("rebind", *config, "--tenant", "acme", "--to-queue", "spring:*")
        assert rebind.returncode == 2 and "not a glob" in rebind.stderr and "($.to_queue)" in rebind.stderr
        # A glob with a set left open matched nothing ("0 messages due now", exit 0); a port no site has, likewise.
        for command, option, value, says in [
            (
                "retry",
                "--queue",
                "c[12:t4@*",
                "set that is not closed with ']' (for a '[' itself, write '[[]') ($.queue)",
            ),
            ("bounce", "--tenant", "t[1", "set that is not closed with ']' (for a '[' itself, write '[[]') ($.tenant)"),
            ("suspend", "--site", "127.0.0.9:99999", "port 99999 is out of range: a port is 1 to 65535 ($.site)"),
            # A domain or site glob likewise: it stood as a suspension that held nothing.
            ("suspend", "--domain", "[abc", "set that is not closed with ']' ($.domain)"),
            ("suspend", "--site", "mx[1.test", "set that is not closed with ']' ($.site)"),
            ("retry", "--domain", "exa[mple.net", "set that is not closed with ']' ($.domain)"),
        ]:
            refused = pigeon_cli(command, *config, option, value)
            assert (refused.returncode, refused.stdout) == (2, ""), (command, refused.stdout, refused.stderr)
            assert refused.stderr.startswith("pigeon: 400: ") and refused.stderr.rstrip().endswith(says), refused.stderr


@pytest.mark.parametrize(
    ("name", "says"), [("", "a node's name is needed, not ''"), ("mx 3", "'mx 3' is no node's name")]
)
def test_cluster_forget_of_no_node_name_is_a_usage_error_before_any_request(name: str, says: str) -> None:
    """Found from outside: `pigeon cluster forget ''` asked for /api/v1/cluster/nodes/ and said
    `404: no endpoint at /api/v1/cluster/nodes/; ...`, naming no mistake of the command line's."""
    with socket.socket() as listener:  # where the request would go: nothing may connect
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.2)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        command = ["cluster", "forget", name, "--url", url, "--token", "t" * 20]
        # (A request would wait for an answer that never comes: 10 s tell it.)
        refused = zygote.run(command, text=True, timeout=10)
        with pytest.raises(TimeoutError):
            listener.accept()
    assert (refused.returncode, refused.stdout) == (2, ""), refused
    assert refused.stderr.splitlines()[0].startswith("usage: pigeon cluster forget "), refused.stderr
    assert f"pigeon cluster forget: error: argument NODE: {says}" in refused.stderr, refused.stderr
    assert "404" not in refused.stderr, refused.stderr
