"""Usage errors of the commands: refused before any request, exit 2, with the usage of the
command that was mistyped (an outside tester found each of these)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pigeon.cli.main import main

_NODE = ["--url", "http://127.0.0.1:9", "--token", "t"]  # nothing listens: a request would exit 3


@pytest.mark.parametrize("interval", ["0", "-1", "0.05", "nan", "inf", "1e300", "soon"])
def test_top_interval_not_from_a_tenth_of_a_second_to_a_day_is_a_usage_error(
    interval: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # 0 polled every worker without rest; -1 --once ended in a traceback (sleep length must
    # be non-negative); 1e300 would have overflowed the sleep.
    with pytest.raises(SystemExit) as exited:
        main(["top", "--interval", interval, "--once", *_NODE])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("usage: pigeon top ") and "argument --interval:" in error


@pytest.mark.parametrize(
    ("argv", "command", "unknown"),
    [
        (["bounce", "--durration", "1h", "--domain", "example.net"], "pigeon bounce", "--durration 1h"),
        (["queue", "summary", "--clustr"], "pigeon queue summary", "--clustr"),
        (["top", "--once", "extra"], "pigeon top", "extra"),
    ],
)
def test_an_unknown_option_is_refused_with_its_commands_usage(
    argv: list[str], command: str, unknown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*argv, *_NODE])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"usage: {command} "), error  # not `pigeon [-h] [--version] COMMAND ...`
    assert f"{command}: error: unrecognized arguments: {unknown}\n" in error


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["suspend", "--list", "--domain", "example.net"], "--list takes no --domain"),
        (["bounce", "--list", "--tenant", "acme", "--reason", "x"], "--list takes no --tenant, --reason"),
        (["bounce", "--cancel", "abc123", "--domain", "example.net"], "--cancel takes no --domain"),
        (["bounce", "--list", "--cancel", "abc123"], "--list takes no --cancel"),
        (["suspend", "--list", "--site", "mx.example.net", "--duration", "1h"], "--list takes no --site, --duration"),
    ],
)
def test_list_or_cancel_with_what_only_a_new_rule_takes_is_refused(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `pigeon suspend --list --domain x` listed every suspension, not those of x, without a word.
    assert main([*argv, *_NODE]) == 2
    assert said in capsys.readouterr().err


def test_logs_given_no_log_directory_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # It exited 1, where every other usage error exits 2.
    assert main(["logs", "--dir", str(tmp_path / "nonexist")]) == 2
    assert capsys.readouterr().err == f"pigeon: no log directory: --dir {tmp_path / 'nonexist'} does not exist\n"
    (tmp_path / "file").touch()
    assert main(["logs", "--dir", str(tmp_path / "file")]) == 2
    assert capsys.readouterr().err == f"pigeon: no log directory: --dir {tmp_path / 'file'} is not a directory\n"
