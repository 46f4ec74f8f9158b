"""SMTP AUTH users: salted scrypt hashes in a file that `pigeon passwd` writes and the listener
reads; a wrong password, an unknown user or a damaged entry never authenticates."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pigeon.listener.passwords import (
    PasswordFile,
    PasswordFileError,
    hash_password,
    set_password,
    verify_password,
)

FAST = {"n": 2**10, "r": 8, "p": 1}  # cheaper than the default cost, same format


def test_hashed_password_verifies_and_a_wrong_one_does_not() -> None:
    stored = hash_password("correct horse", **FAST)

    assert stored.startswith("$scrypt$n=1024,r=8,p=1$")
    assert verify_password(stored, "correct horse") is True
    assert verify_password(stored, "correct horse ") is False
    assert verify_password(stored, "") is False


def test_non_ascii_password_round_trips() -> None:
    stored = hash_password("pässwörd-пароль", **FAST)
    assert verify_password(stored, "pässwörd-пароль") is True
    assert verify_password(stored, "passwort-пароль") is False


def test_same_password_hashes_differently_each_time() -> None:
    assert hash_password("secret", **FAST) != hash_password("secret", **FAST)


def test_default_cost_is_the_documented_one() -> None:
    stored = hash_password("secret")
    assert stored.startswith("$scrypt$n=16384,r=8,p=1$")
    assert verify_password(stored, "secret") is True


@pytest.mark.parametrize(
    "stored",
    [
        "",
        "garbage",
        "$bcrypt$n=1024,r=8,p=1$c2FsdA$aGFzaA",
        "$scrypt$n=1024$c2FsdA$aGFzaA",
        "$scrypt$n=1024,r=8,p=1$!!$aGFzaA",
    ],
    ids=["empty", "garbage", "other-scheme", "missing-params", "bad-base64"],
)
def test_unusable_stored_value_never_verifies(stored: str) -> None:
    assert verify_password(stored, "anything") is False


@pytest.mark.parametrize(
    "stored",
    ["$scrypt$n=1000,r=8,p=1$c2FsdA$aGFzaA", "$scrypt$n=1024,r=0,p=1$c2FsdA$aGFzaA", "$scrypt$n=1024,r=8,p=1$c2FsdA$"],
    ids=["n-not-power-of-two", "r-zero", "empty-hash"],
)
def test_entry_with_impossible_scrypt_parameters_is_refused_at_load_and_never_verifies(
    tmp_path: Path, stored: str
) -> None:
    users = tmp_path / "users"
    users.write_text(f"# users\nalice:{stored}\n")
    with pytest.raises(PasswordFileError, match=r", line 2: "):
        PasswordFile.load(users)
    assert verify_password(stored, "anything") is False


# --- the users file --------------------------------------------------------------------------
def test_users_file_skips_comments_and_blank_lines(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text(
        "# Pigeon users\n"
        "\n"
        f"alice:{hash_password('alice-pw', **FAST)}\n"
        "   \n"
        "  # bob left\n"
        f"  carol:{hash_password('carol-pw', **FAST)}  \n"
    )

    loaded = PasswordFile.load(users)

    assert len(loaded) == 2
    assert loaded.check("alice", "alice-pw") is True
    assert loaded.check("carol", "carol-pw") is True
    assert loaded.check("alice", "carol-pw") is False


@pytest.mark.parametrize(
    "bad_line",
    ["alice", "alice:plaintext", ":$scrypt$n=1024,r=8,p=1$c2FsdA$aGFzaA", "alice $scrypt$n=1024,r=8,p=1$c2FsdA$aGFzaA"],
    ids=["no-colon", "not-a-hash", "no-name", "space-not-colon"],
)
def test_malformed_line_is_refused_naming_the_file_and_line(tmp_path: Path, bad_line: str) -> None:
    users = tmp_path / "users"
    users.write_text(f"# users\n\nbob:{hash_password('x', **FAST)}\n{bad_line}\n")

    with pytest.raises(PasswordFileError) as caught:
        PasswordFile.load(users)
    message = str(caught.value)
    assert message.startswith(f"{users}, line 4: ")
    assert "pigeon passwd" in message


def test_unreadable_users_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PasswordFileError, match="cannot read the users file") as caught:
        PasswordFile.load(tmp_path / "absent")
    assert str(tmp_path / "absent") in str(caught.value)


def test_unknown_user_is_refused(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text(f"alice:{hash_password('pw', **FAST)}\n")
    loaded = PasswordFile.load(users)

    assert loaded.check("mallory", "pw") is False
    assert loaded.check("", "pw") is False
    assert loaded.check("Alice", "pw") is False  # names are exact


# --- set_password ------------------------------------------------------------------------------
def test_set_password_creates_the_file_with_mode_0600(tmp_path: Path) -> None:
    users = tmp_path / "users"
    set_password(users, "alice", "first")

    assert stat.S_IMODE(users.stat().st_mode) == 0o600
    assert PasswordFile.load(users).check("alice", "first") is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["users"]  # no temporary file left


def test_set_password_adds_users_and_replaces_an_existing_entry(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text(f"# managed by pigeon passwd\nalice:{hash_password('old', **FAST)}\n")
    os.chmod(users, 0o644)

    set_password(users, "bob", "bob-pw")
    set_password(users, "alice", "new")

    lines = users.read_text().splitlines()
    assert lines[0] == "# managed by pigeon passwd"
    assert [line.split(":", 1)[0] for line in lines[1:]] == ["alice", "bob"]  # replaced in place, not appended
    loaded = PasswordFile.load(users)
    assert len(loaded) == 2
    assert loaded.check("alice", "new") is True
    assert loaded.check("alice", "old") is False
    assert loaded.check("bob", "bob-pw") is True
    assert stat.S_IMODE(users.stat().st_mode) == 0o600


@pytest.mark.parametrize("name", ["", "a:b", "two words", "tab\tname"])
def test_set_password_refuses_names_the_file_cannot_hold(tmp_path: Path, name: str) -> None:
    users = tmp_path / "users"
    with pytest.raises(PasswordFileError, match="user name"):
        set_password(users, name, "pw")
    assert not users.exists()


# --- tenant bindings ---------------------------------------------------------------------------
def test_a_line_may_bind_its_user_to_tenants(tmp_path: Path) -> None:
    users = tmp_path / "users"
    stored = hash_password("pw", **FAST)
    users.write_text(f"alice:{stored}:tenants=A,B\nbob:{stored}\ncarol:{stored}:tenants=\ndave:{stored}:tenants= C \n")
    loaded = PasswordFile.load(users)

    assert loaded.check("alice", "pw") is True  # the option is no part of the hash
    assert loaded.binding("alice") == frozenset({"A", "B"})
    assert loaded.binding("bob") is None  # unbound: any tenant
    assert loaded.binding("carol") == frozenset()  # bound to none: may name no tenant
    assert loaded.binding("dave") == frozenset({"C"})
    assert loaded.binding("mallory") is None
    assert "alice" in loaded and "mallory" not in loaded


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("tenant=A", "unknown option 'tenant'"),  # a typo must not leave the user unbound
        ("tenants=A B", "tenants=: tenant 'A B' contains ' '"),
        ("tenants=A,,B", "tenants=: a tenant name is empty"),
        ("tenants=a\x1bb", "tenants=: tenant 'a\\x1bb' contains"),
    ],
)
def test_a_binding_that_names_no_tenant_stops_the_file_from_loading(tmp_path: Path, option: str, said: str) -> None:
    users = tmp_path / "users"
    users.write_text(f"alice:{hash_password('pw', **FAST)}:{option}\n")
    with pytest.raises(PasswordFileError) as caught:
        PasswordFile.load(users)
    assert str(caught.value).startswith(f"{users}, line 1: {said}"), caught.value


def test_a_new_password_keeps_the_binding_unless_given_another(tmp_path: Path) -> None:
    users = tmp_path / "users"
    set_password(users, "alice", "first", ["B", "A"])
    assert users.read_text().rstrip("\n").endswith(":tenants=A,B")
    set_password(users, "alice", "second")
    loaded = PasswordFile.load(users)
    assert loaded.check("alice", "second") is True
    assert loaded.binding("alice") == frozenset({"A", "B"})
    set_password(users, "alice", "third", ["C"])
    assert PasswordFile.load(users).binding("alice") == frozenset({"C"})
    with pytest.raises(PasswordFileError, match="contains ':'"):
        set_password(users, "alice", "fourth", ["a:b"])
    assert PasswordFile.load(users).check("alice", "third") is True  # nothing changed
