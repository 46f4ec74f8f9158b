"""`pigeon sendmail`, the sendmail(1) command line cron, PHP's mail() and logwatch call: what
they pipe reaches the recipients they name (or the message names, with -t) through the node's
SMTP listener, and the exit status says what sysexits.h says sendmail's does."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pigeon.cli import sendmail as sendmail_command
from pigeon.cli.sendmail import Options, UsageError, parse
from pigeon.config.load import ConfigError
from tests.support.ports import free_port
from tests.support.process import PigeonProcess, to_toml
from tests.support.sinks import Received, ScriptedSink, delivery_config, wait_until

POLICY = """
from pigeon.policy import Refuse

def on_rcpt_to(rcpt):
    if rcpt.recipient.startswith("no@"):
        return Refuse(550, "no such user here")
    if rcpt.recipient.startswith("later@"):
        return Refuse(451, "not now")
    return None
"""


@pytest.fixture(scope="module")
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink(smtputf8=True) as sink:  # (for a non-ASCII -f)
        yield sink


@pytest.fixture(scope="module")
def node(sink: ScriptedSink, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    root = tmp_path_factory.mktemp("node")
    (root / "sendmail_policy.py").write_text(POLICY)
    with PigeonProcess(root, policy={"module": "sendmail_policy"}, **delivery_config(sink.endpoint)) as pigeon:
        yield pigeon


def sendmail(
    config: Path, *args: str, message: bytes, program: list[str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    command = program or [sys.executable, "-m", "pigeon", "sendmail"]
    env = {**os.environ, "PIGEON_CONFIG": str(config)}
    return subprocess.run([*command, *args], input=message, capture_output=True, timeout=60, env=env)


def arrived(sink: ScriptedSink, marker: bytes) -> Received:
    """The message the sink took whose content holds `marker` (each test's own)."""
    return wait_until(lambda: next((m for m in sink.received if marker in m.data), None))


def test_t_sends_to_to_cc_and_bcc_and_what_arrives_has_no_bcc_field(node: PigeonProcess, sink: ScriptedSink) -> None:
    message = (
        b"From: cron@example.org\n"
        b"To: Ann <to@example.net>\n"
        b"Cc: cc@example.net,\n    other-cc@example.net\n"
        b"Bcc: hidden@example.net\n"
        b"Subject: nightly\n"
        b"\n"
        b"marker-t\n"
    )
    result = sendmail(node.config_path, "-t", "-oi", "-odi", "-oem", message=message)
    assert result.returncode == 0, result.stderr
    got = arrived(sink, b"marker-t")
    assert sorted(got.recipients) == ["cc@example.net", "hidden@example.net", "other-cc@example.net", "to@example.net"]
    headers = got.data.split(b"\r\n\r\n", 1)[0]
    assert b"Bcc" not in headers and b"hidden@" not in headers
    assert got.email["To"] == "Ann <to@example.net>" and got.email["Subject"] == "nightly"
    # A message without them leaves with a Date and a Message-ID (the node adds them to an
    # AUTH submission only), as Postfix's cleanup adds them.
    assert got.email["Date"] and got.email["Message-ID"].endswith("@mx.pigeon.test>")


def test_f_sets_the_envelope_sender_and_f_capital_the_from_it_adds(node: PigeonProcess, sink: ScriptedSink) -> None:
    result = sendmail(node.config_path, "-f", "bounces@example.org", "-FBackup Job", "to@example.net",
                      message=b"Subject: backup\n\nmarker-f\n")  # fmt: skip
    assert result.returncode == 0, result.stderr
    got = arrived(sink, b"marker-f")
    assert got.sender == "bounces@example.org" and got.recipients == ["to@example.net"]
    assert got.email["From"] == "Backup Job <bounces@example.org>"


def test_without_f_the_sender_is_the_invoking_user_at_the_configured_hostname(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    result = sendmail(node.config_path, "to@example.net", message=b"Subject: who\n\nmarker-user\n")
    assert result.returncode == 0, result.stderr
    user = pwd.getpwuid(os.getuid()).pw_name
    assert arrived(sink, b"marker-user").sender == f"{user}@mx.pigeon.test"


def test_i_keeps_a_line_with_a_lone_dot_and_without_it_the_dot_ends_the_message(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    message = b"Subject: dots\n\nmarker-%s\n.\nafter the dot\n"
    assert sendmail(node.config_path, "-i", "to@example.net", message=message % b"i").returncode == 0
    assert arrived(sink, b"marker-i").data.endswith(b"marker-i\r\n.\r\nafter the dot\r\n")
    assert sendmail(node.config_path, "to@example.net", message=message % b"dot").returncode == 0
    got = arrived(sink, b"marker-dot")
    assert got.data.endswith(b"marker-dot\r\n") and b"after the dot" not in got.data


def test_a_recipient_the_node_refuses_exits_67_and_the_others_still_get_it(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    result = sendmail(node.config_path, "no@example.net", "ok@example.net", message=b"Subject: x\n\nmarker-67\n")
    assert result.returncode == 67, result.stderr
    assert b"<no@example.net>: 550 5.7.1 no such user here" in result.stderr
    assert arrived(sink, b"marker-67").recipients == ["ok@example.net"]


def test_a_recipient_refused_for_now_exits_75_and_sends_to_no_one(node: PigeonProcess, sink: ScriptedSink) -> None:
    result = sendmail(node.config_path, "later@example.net", "ok@example.net", message=b"Subject: x\n\nmarker-451\n")
    assert result.returncode == 75, result.stderr
    assert b"<later@example.net>: 451 4.7.1 not now" in result.stderr and b"nothing sent" in result.stderr
    # One sent after it arrives; it never does (refused before DATA: never in the spool).
    assert sendmail(node.config_path, "ok@example.net", message=b"Subject: x\n\nmarker-after\n").returncode == 0
    arrived(sink, b"marker-after")
    assert not any(b"marker-451" in m.data for m in sink.received)


def test_the_node_down_exits_75_ex_tempfail_saying_so(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    config = tmp_path / "pigeon.toml"
    config.write_text(to_toml({"smtp": {"listen": [f"127.0.0.1:{port}"], "hostname": "mx.pigeon.test"}}))
    result = sendmail(config, "-t", message=b"To: to@example.net\n\nhi\n")
    assert result.returncode == 75
    assert f"cannot reach the Pigeon node at 127.0.0.1:{port}".encode() in result.stderr
    assert b"try again later" in result.stderr and b"Traceback" not in result.stderr


def test_invoked_as_sendmail_through_a_link_it_is_the_sendmail_command(
    node: PigeonProcess, sink: ScriptedSink, tmp_path: Path
) -> None:
    # What `ln -s "$(command -v pigeon)" /usr/sbin/sendmail` runs: the `pigeon` script, as
    # `sendmail`.
    script = tmp_path / "pigeon"
    script.write_text("import sys\nfrom pigeon.cli.main import main\nsys.exit(main())\n")
    (tmp_path / "sendmail").symlink_to(script)
    program = [sys.executable, str(tmp_path / "sendmail")]
    result = sendmail(node.config_path, "-t", "-i", message=b"To: link@example.net\n\nmarker-link\n", program=program)
    assert result.returncode == 0, result.stderr
    assert arrived(sink, b"marker-link").recipients == ["link@example.net"]


def test_an_unknown_option_is_refused_with_exit_64_naming_it(tmp_path: Path) -> None:
    result = sendmail(tmp_path / "none.toml", "-Z", "to@example.net", message=b"")
    assert result.returncode == 64
    assert b"unknown option -Z" in result.stderr
    assert sendmail(tmp_path / "none.toml", message=b"").returncode == 64  # no recipient


def test_options_as_callers_write_them() -> None:
    assert parse(["-t", "-i"]).extract and not parse(["-t", "-i"]).dots
    assert not parse(["-oi", "a@x"]).dots and parse(["-odi", "-oem", "-om", "a@x"]).dots
    assert parse(["-fme@example.org", "a@x"]).sender == "me@example.org"
    assert parse(["-r", "<>", "a@x"]).sender == ""
    assert parse(["-F", "Cron Daemon", "a@x"]).full_name == "Cron Daemon"
    assert parse(["--", "-odd@x", "b@x, c@x"]).recipients == ["-odd@x", "b@x", "c@x"]
    assert parse(["-f", " Boss <ceo@corp.test> ", "a@x"]).sender == "ceo@corp.test"
    assert parse(["-f", "root (Cron Daemon)", "a@x"]).sender == "root"
    assert [parse([f"-b{m}"]).mode for m in "msip"] == ["mail", "smtp", "aliases", "queue"]
    for refused in (["-bd"], ["-q"], ["-f"]):
        with pytest.raises(UsageError):
            parse(refused)


def test_a_user_who_may_not_read_the_default_config_submits_to_loopback_port_25(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The README's systemd set-up makes /etc/pigeon/pigeon.toml 0640 (it may hold token
    # secrets): a cron job of another user must still find the node. (The tests run as root,
    # who reads any file: the refusal is the one `read_text` gives for EACCES.)
    config = tmp_path / "pigeon.toml"
    config.write_text('[smtp]\nlisten = ["127.0.0.1:2600"]\nhostname = "mx.pigeon.test"\n')
    monkeypatch.delenv("PIGEON_CONFIG", raising=False)
    monkeypatch.setattr(sendmail_command, "DEFAULT_CONFIG", config)
    readable = sendmail_command.find_node(Options())
    assert (readable.host, readable.port, readable.domain) == ("127.0.0.1", 2600, "mx.pigeon.test")

    def unreadable(path: Path) -> str:
        try:
            raise PermissionError(13, "Permission denied")
        except PermissionError as error:
            raise ConfigError(f"{path}: cannot read the configuration file: {error.strerror}") from None

    monkeypatch.setattr(sendmail_command, "read_text", unreadable)
    node = sendmail_command.find_node(Options())
    assert (node.host, node.port) == ("127.0.0.1", 25)
    with pytest.raises(ConfigError, match="Permission denied"):  # named with -C: said so (78)
        sendmail_command.find_node(Options(config=config))


def headers_of(got: Received) -> bytes:
    return got.data.split(b"\r\n\r\n", 1)[0]


@pytest.mark.parametrize(
    "option",
    [["-F", "Evil\r\nBcc: x@example.net"], ["-f", "a@example.org\r\nRSET"], ["-N", "never\r\nRSET"],
     ["-R", "full\nX"], ["-V", "id\r\nRSET"], ["to@example.net\r\nRSET"]],
)  # fmt: skip
def test_a_control_character_in_an_option_is_refused_as_usage_and_nothing_sent(
    node: PigeonProcess, sink: ScriptedSink, option: list[str]
) -> None:
    # A CR LF in -F would end the From field it fills: what follows would be a field of the
    # caller's choosing; in -f, -N, -R, -V one would end the SMTP command.
    result = sendmail(node.config_path, *option, "to@example.net", message=b"Subject: x\n\nmarker-ctl\n")
    assert result.returncode == 64, result.stderr
    assert b"U+000D" in result.stderr or b"U+000A" in result.stderr
    assert b"\\\\x0" not in result.stderr  # (the value shown escaped once: "Evil\x0d\x0aBcc")
    assert b"internal error" not in result.stderr
    assert not any(b"marker-ctl" in m.data for m in sink.received)


def test_cron_output_with_long_lines_bare_crs_and_nuls_arrives_readable(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    long_line = b"x" * 1200
    message = (
        b"Subject: backup " + b"y" * 1100 + b"\n\n"
        b"marker-cron\n"
        b" 10%\r 50%\r100%\n"
        b"nul\0here\n" + long_line + b"\n" + "é".encode() * 700 + b"\n"
    )
    result = sendmail(node.config_path, "to@example.net", message=message)
    assert result.returncode == 0, result.stderr
    got = arrived(sink, b"marker-cron")
    assert all(len(line) <= 998 for line in got.data.split(b"\r\n"))
    assert b"\0" not in got.data and b"\r" not in got.data.replace(b"\r\n", b"")
    body = got.data.split(b"\r\n\r\n", 1)[1]
    # A bare CR ends a line; a long line goes on on the next; a NUL is gone.
    assert b"marker-cron\r\n 10%\r\n 50%\r\n100%\r\nnulhere\r\n" + b"x" * 998 + b"\r\n" + b"x" * 202 + b"\r\n" in body
    assert "é" * 700 in body.replace(b"\r\n", b"").decode()  # never broken inside a character
    # In the header section, the field is folded (a space put in where it has none).
    assert got.email["Subject"].replace(" ", "") == "backup" + "y" * 1100


def test_the_message_names_the_local_user_who_submitted_it_in_a_received_field(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    result = sendmail(node.config_path, "-f", "ceo@corp.test", "to@example.net", message=b"Subject: x\n\nmarker-uid\n")
    assert result.returncode == 0, result.stderr
    received = arrived(sink, b"marker-uid").email.get_all("Received")
    # The node's own first, then the one sendmail added, as Postfix's "(Postfix, from userid N)".
    assert len(received) == 2 and "(Pigeon)" in received[0]
    assert received[1].startswith(f"by mx.pigeon.test (Pigeon sendmail, from userid {os.getuid()});")


def test_a_bare_or_named_f_address_is_taken_as_postfix_takes_it(node: PigeonProcess, sink: ScriptedSink) -> None:
    for sender, marker in (("www-data", b"marker-bare"), (" Boss <ceo@corp.test> ", b"marker-named")):
        result = sendmail(node.config_path, "-f", sender, "to@example.net", message=b"Subject: x\n\n%s\n" % marker)
        assert result.returncode == 0, result.stderr
    assert arrived(sink, b"marker-bare").sender == "www-data@mx.pigeon.test"
    assert arrived(sink, b"marker-named").sender == "ceo@corp.test"


def test_an_f_that_is_no_one_address_is_refused_and_adds_no_esmtp_parameter(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    for sender in ("a@b.example> ENVID=zz", "a@b.example, c@d.example", "two words@example.org"):
        result = sendmail(node.config_path, "-f", sender, "to@example.net", message=b"Subject: x\n\nmarker-nf\n")
        assert result.returncode == 64, (sender, result.stderr)
        assert b"not an address" in result.stderr
    assert not any(b"marker-nf" in m.data for m in sink.received)


def test_an_f_of_words_with_no_address_is_refused_naming_it_not_cut_to_its_first_word(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    # "John Doe" went as MAIL FROM:<John@host>: bounces to an address nobody meant. Postfix's
    # sendmail takes -f's argument as one address; words that are none are refused (64) as a
    # recipient's are, the value named.
    for sender in ("John Doe", "Doe, John <jd@corp.test>", "John Doe (the boss)"):
        result = sendmail(node.config_path, "-f", sender, "to@example.net", message=b"Subject: x\n\nmarker-words\n")
        assert result.returncode == 64, (sender, result.stderr)
        assert f"-f '{sender}': not an address".encode() in result.stderr, result.stderr
    # What names one address still goes, as Postfix's sendmail takes it.
    for sender, marker in (('"Doe, John" <jd@corp.test>', b"marker-quoted"), ("<jd@corp.test>", b"marker-angle")):
        result = sendmail(node.config_path, "-f", sender, "to@example.net", message=b"Subject: x\n\n%s\n" % marker)
        assert result.returncode == 0, (sender, result.stderr)
        assert arrived(sink, marker).sender == "jd@corp.test"
    assert not any(b"marker-words" in m.data for m in sink.received)


def test_a_non_ascii_f_is_sent_with_smtputf8(node: PigeonProcess, sink: ScriptedSink) -> None:
    result = sendmail(node.config_path, "-f", "jörg@corp.test", "-F", "Jörg", "to@example.net",
                      message=b"Subject: x\n\nmarker-utf8\n")  # fmt: skip
    assert result.returncode == 0, result.stderr
    got = arrived(sink, b"marker-utf8")
    assert got.sender == "jörg@corp.test"
    assert got.email["From"] == "Jörg <jörg@corp.test>"


def test_bare_addresses_in_the_header_get_the_domain_and_keep_their_names(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    message = (
        b"From: root (Cron Daemon)\n"
        b"To: pfvuser, Ann <ann>, b@example.net\n"
        b"Reply-To: undisclosed-recipients:;\n"
        b"Resent-To: =?utf-8?q?J=C3=B6rg?= <jorg>\n"
        b"Resent-Bcc: secret@example.net\n"
        b"Subject: =?utf-8?q?caf=C3=A9?= root\n"
        b"\n"
        b"marker-qualify\n"
    )
    result = sendmail(node.config_path, "-t", message=message)
    assert result.returncode == 0, result.stderr
    # (-t takes the bare ones qualified too: those @mx.pigeon.test leave in a transaction of their
    # own, which may reach the sink first; this looks at the example.net one)
    got = wait_until(
        lambda: next(
            (m for m in sink.received if b"marker-qualify" in m.data and "b@example.net" in m.recipients), None
        )
    )
    headers = headers_of(got)
    assert b"\r\nFrom: root@mx.pigeon.test (Cron Daemon)\r\n" in headers
    assert b"\r\nTo: pfvuser@mx.pigeon.test, Ann <ann@mx.pigeon.test>, b@example.net\r\n" in headers
    assert b"\r\nReply-To: undisclosed-recipients:;\r\n" in headers
    assert b"\r\nResent-To: =?utf-8?q?J=C3=B6rg?= <jorg@mx.pigeon.test>\r\n" in headers
    assert b"\r\nSubject: =?utf-8?q?caf=C3=A9?= root\r\n" in headers  # (not an address field: as it was)
    assert b"Resent-Bcc" not in headers and b"secret@" not in headers  # removed, as Bcc is
    assert got.recipients == ["b@example.net"]


@pytest.mark.parametrize("notify", ["bogus", "never,success"])
def test_a_wrong_n_is_refused_before_anything_is_sent(tmp_path: Path, notify: str) -> None:
    result = sendmail(tmp_path / "none.toml", "-N", notify, "to@example.net", message=b"Subject: x\n\nx\n")
    assert result.returncode == 64 and b"-N" in result.stderr


def test_bs_relays_an_smtp_session_and_the_message_names_the_user(node: PigeonProcess, sink: ScriptedSink) -> None:
    # What Symfony Mailer and Laravel run: `sendmail -bs -i`, then SMTP on its stdin/stdout.
    session = (
        b"EHLO app.example\r\n"
        b"MAIL FROM:<app@example.org>\r\n"
        b"RCPT TO:<to@example.net>\r\n"
        b"DATA\r\n"
        b"From: app@example.org\r\nSubject: x\r\n\r\nmarker-bs\r\n.\r\n"
        b"QUIT\r\n"
    )
    result = sendmail(node.config_path, "-bs", "-i", message=session)
    assert result.returncode == 0, result.stderr
    replies = [line[:3] for line in result.stdout.split(b"\r\n") if line[3:4] == b" "]
    assert replies == [b"220", b"250", b"250", b"250", b"354", b"250", b"221"], result.stdout
    got = arrived(sink, b"marker-bs")
    assert got.sender == "app@example.org" and got.recipients == ["to@example.net"]
    received = got.email.get_all("Received")
    assert received[1].startswith(f"by mx.pigeon.test (Pigeon sendmail, from userid {os.getuid()});")


def test_newaliases_is_a_no_op_and_mailq_points_to_pigeon_queue_list(tmp_path: Path) -> None:
    script = tmp_path / "pigeon"
    script.write_text("import sys\nfrom pigeon.cli.main import main\nsys.exit(main())\n")
    for name in ("newaliases", "mailq"):
        (tmp_path / name).symlink_to(script)
    newaliases = sendmail(tmp_path / "none.toml", message=b"", program=[sys.executable, str(tmp_path / "newaliases")])
    assert newaliases.returncode == 0 and newaliases.stderr == b""
    mailq = sendmail(tmp_path / "none.toml", message=b"", program=[sys.executable, str(tmp_path / "mailq")])
    assert mailq.returncode == 64 and b"pigeon queue list" in mailq.stderr


def test_a_gecos_ampersand_is_the_capitalised_login() -> None:
    user = pwd.struct_passwd(("ann", "x", 1000, 1000, "& Smith,,,", "/home/ann", "/bin/sh"))
    assert sendmail_command._full_name(Options(), user) == "Ann Smith"
    assert sendmail_command._full_name(Options(full_name="Given"), user) == "Given"
