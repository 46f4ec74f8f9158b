"""`pigeon passwd`, run as an operator runs it: `-c FILE` creates the users file (0600) as
htpasswd does; without it a missing file is an error that says how to create it."""

from __future__ import annotations

import signal
import smtplib
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pigeon.listener.passwords import PasswordFile
from tests.support import zygote
from tests.support.process import PigeonProcess


def passwd(*args: str, password: str = "s3cret") -> subprocess.CompletedProcess[str]:
    return zygote.run(["passwd", *args, "--stdin"], input=password + "\n", text=True, timeout=60)


def test_passwd_c_creates_the_users_file_with_mode_0600(tmp_path: Path) -> None:
    users = tmp_path / "users"
    result = passwd("-c", str(users), "alice")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"alice: password set in {users} (created, mode 0600)"
    assert stat.S_IMODE(users.stat().st_mode) == 0o600
    assert PasswordFile.load(users).check("alice", "s3cret")


def test_passwd_c_on_an_existing_file_adds_the_user_and_keeps_the_others(tmp_path: Path) -> None:
    users = tmp_path / "users"
    assert passwd("-c", str(users), "alice").returncode == 0
    result = passwd("-c", str(users), "bob", password="other")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"bob: password set in {users}"
    loaded = PasswordFile.load(users)
    assert loaded.check("alice", "s3cret") and loaded.check("bob", "other")


def test_passwd_without_c_refuses_a_missing_file_and_names_c(tmp_path: Path) -> None:
    users = tmp_path / "users"
    result = passwd("--file", str(users), "alice")
    assert result.returncode == 2
    assert result.stderr == f"pigeon: {users}: no such users file; to create it: pigeon passwd -c {users} alice\n"
    assert not users.exists()


def test_passwd_with_a_config_whose_users_file_is_missing_says_how_to_create_it(tmp_path: Path) -> None:
    config = tmp_path / "pigeon.toml"
    config.write_text('[smtp]\nauth_users = "users"\n')
    result = passwd("--config", str(config), "alice")
    assert result.returncode == 2
    assert f"create it: pigeon passwd -c {tmp_path / 'users'} USER" in result.stderr
    assert passwd("-c", str(tmp_path / "users"), "alice").returncode == 0
    assert passwd("--config", str(config), "bob").returncode == 0  # now it exists
    assert len(PasswordFile.load(tmp_path / "users")) == 2


def test_passwd_refuses_to_write_into_a_file_that_is_not_a_users_file(tmp_path: Path) -> None:
    """`pigeon passwd -c pigeon.toml alice`, from a habit of `-c` for the configuration."""
    config = tmp_path / "pigeon.toml"
    config.write_text('[smtp]\nauth_users = "users"\n')
    result = passwd("-c", str(config), "alice")
    assert result.returncode == 2  # a usage error, as the README's table of exit statuses says
    assert result.stderr == f"pigeon: {config}, line 1: not a users file (expected user:$scrypt$...); nothing changed\n"
    assert config.read_text() == '[smtp]\nauth_users = "users"\n'


def test_passwd_checks_the_file_before_asking_for_the_password(tmp_path: Path) -> None:
    """A configuration given for `--file`, or a users file that cannot be read, was refused
    only after the password had been typed twice, and with exit status 1 (refused), not 2."""
    config = tmp_path / "pigeon.toml"
    config.write_text('[smtp]\nauth_users = "users"\n')
    unreadable = tmp_path / "users"
    unreadable.mkdir()  # (a directory: unreadable as a file, even by root)
    for path, said in (
        (config, f"pigeon: {config}, line 1: not a users file (expected user:$scrypt$...); nothing changed\n"),
        (unreadable, f"pigeon: {unreadable}: cannot read the users file: [Errno 21] Is a directory: "
                     f"'{unreadable}'; nothing changed\n"),
    ):  # fmt: skip
        for option in ("--file", "-c"):
            # Not --stdin: the password is asked for, on stderr in a session without a terminal.
            result = subprocess.run([sys.executable, "-m", "pigeon", "passwd", option, str(path), "bob"],
                                    input="s\ns\n", capture_output=True, text=True, timeout=60,
                                    start_new_session=True)  # fmt: skip
            assert (result.returncode, result.stderr) == (2, said)
            assert "Password" not in result.stdout
    assert config.read_text() == '[smtp]\nauth_users = "users"\n'


def test_passwd_refuses_a_bad_user_name_before_asking_for_the_password(tmp_path: Path) -> None:
    users = tmp_path / "users"
    for name in ("bad user", "x:y"):
        # Not --stdin: the password would be asked for (twice) first, and only then refused.
        result = zygote.run(["passwd", "-c", str(users), name], input="", text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert "Password for" not in result.stdout + result.stderr
        assert f"pigeon: {name!r}: a user name must be non-empty, without ':'" in result.stderr
    assert not users.exists()


def test_passwd_into_a_directory_that_does_not_exist_names_it(tmp_path: Path) -> None:
    users = tmp_path / "missing" / "users"
    result = passwd("-c", str(users), "alice")
    assert result.returncode == 2
    assert result.stderr == f"pigeon: {users}: the directory {users.parent} does not exist; nothing changed\n"


def test_passwd_says_a_running_node_takes_the_user_at_sighup_as_it_does(tmp_path: Path) -> None:
    """Without the hint, an operator who added a user to a running node saw AUTH refuse it (535)
    and suspected the password."""
    users = tmp_path / "users"
    assert passwd("-c", str(users), "alice").returncode == 0
    smtp = {"auth_users": str(users), "allow_plaintext_auth": True}
    with PigeonProcess(tmp_path / "node", smtp=smtp) as pigeon:
        result = passwd("--file", str(users), "bob", password="bob-secret")
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[1:] == [
            "a running node takes the change at SIGHUP (systemctl reload pigeon, or kill -HUP its pid); until then "
            "AUTH checks the users it read last"
        ]
        with (
            smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client,
            pytest.raises(smtplib.SMTPAuthenticationError) as refused,
        ):
            client.login("bob", "bob-secret")
        assert refused.value.smtp_code == 535
        assert pigeon.process is not None
        pigeon.process.send_signal(signal.SIGHUP)
        pigeon.wait_stderr("reloaded:")
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
            assert client.login("bob", "bob-secret")[0] == 235


def test_passwd_tenants_binds_the_user_and_a_new_password_keeps_the_binding(tmp_path: Path) -> None:
    users = tmp_path / "users"
    assert passwd("-c", str(users), "--tenants", "acme, globex", "alice").returncode == 0
    assert users.read_text().rstrip("\n").endswith(":tenants=acme,globex")
    assert passwd("--file", str(users), "alice", password="other").returncode == 0
    assert PasswordFile.load(users).binding("alice") == frozenset({"acme", "globex"})
    refused = passwd("--file", str(users), "--tenants", "a b", "alice")
    assert refused.returncode == 2
    assert (
        refused.stderr
        == "pigeon: --tenants: tenant 'a b' contains ' ': no white space, ':' or '@' allowed; nothing changed\n"
    )
    assert PasswordFile.load(users).check("alice", "other")


def test_passwd_with_the_password_piped_but_no_stdin_option_says_to_give_it(tmp_path: Path) -> None:
    """`echo s3cret | pigeon passwd -c users alice`: the password is asked for on a terminal,
    and stdin is none. It read the pipe after Python's `GetPassWarning: Can not control echo on
    the terminal`, naming a file of the interpreter; it now says to add --stdin, and changes nothing."""
    users = tmp_path / "users"
    result = zygote.run(["passwd", "-c", str(users), "alice"], input="s3cret\n", text=True, timeout=60)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "pigeon: stdin is no terminal to ask for the password on: to give it on stdin, add --stdin "
        "(echo PASSWORD | pigeon passwd ... --stdin reads its first line); nothing changed\n"
    )
    assert not users.exists()
