"""`pigeon serve --check` on mistakes a new user makes: each refused (exit 2) naming the file,
line and key as every other config error does, saying what is there and what to write."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_cli import pigeon_cli


def refused(tmp_path: Path, text: str) -> str:
    config = tmp_path / "pigeon.toml"
    config.write_text(text)
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    prefix = f"pigeon: configuration error: {config}, "
    assert result.stderr.startswith(prefix), result.stderr
    return result.stderr.removeprefix(prefix).rstrip("\n")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[route]\ndomain = "a.example"\n', "line 1: [[route]]: expected a list of tables, got one table: head"
         " each block with [[route]] (two brackets), not [route]"),
        ('[queue]\nname = "q"\n', "line 1: [[queue]]: expected a list of tables, got one table: head each block"
         " with [[queue]] (two brackets), not [queue]"),
        ('[http.token]\nname = "a"\n', "line 1: [[http.token]]: expected a list of tables, got one table: head"
         " each block with [[http.token]] (two brackets), not [http.token]"),
        ('[http]\ntoken = { name = "a" }\n', "line 2: [[http.token]]: expected a list of tables, got one table:"
         " head each block with [[http.token]] (two brackets), not [http.token]"),
        ('[[smtp]]\nlisten = "127.0.0.1:25"\n', "line 1: [smtp]: expected a table, got a list of tables: head it"
         " with [smtp] (one bracket), not [[smtp]]"),
    ],
    ids=["route", "queue", "http.token", "inline", "smtp-twice"],
)  # fmt: skip
def test_a_table_written_with_the_wrong_brackets_is_told_the_ones_to_write(
    tmp_path: Path, text: str, said: str
) -> None:
    assert refused(tmp_path, text) == said


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[log]\nlevel = "off"\n', 'line 2: [log] level: expected one of "debug", "info", "warning", "error",'
         ' got "off"'),
        ("[log]\nlevel = 3\n", 'line 2: [log] level: expected one of "debug", "info", "warning", "error", got a'
         " whole number 3"),
        ('[[http.token]]\nname = "a"\ntoken = "0123456789abcdef0"\nscopes = ["reed"]\n', "line 4: [[http.token]]"
         ' #1 scopes: expected one of "inject", "admin", "read", got "reed"'),
        ('[[target]]\nname = "a"\nkind = "kafka"\n', 'line 3: [[target]] #1 kind: expected one of "sidekiq",'
         ' "webhook", "postgresql", "maildir", "log", got "kafka"'),
        ('[[queue]]\nname = "q"\ndsn = "x"\n', 'line 3: [[queue]] #1 dsn: expected true or false, got a string "x"'),
        ('[[queue]]\nname = "q"\ndsn = 3\n', "line 3: [[queue]] #1 dsn: expected true or false, got a whole number"
         " 3"),
    ],
    ids=["enum", "enum-number", "enum-in-list", "target-kind", "queue-dsn", "queue-dsn-number"],
)  # fmt: skip
def test_a_value_out_of_its_choices_is_said_in_lower_case_with_the_value_and_the_choices(
    tmp_path: Path, text: str, said: str
) -> None:
    # Found from outside: "Invalid enum value 'off'" (capital, unlike the rest), and [[queue]]
    # dsn (true or false) hid its value as if it were a [[target]]'s PostgreSQL DSN.
    assert refused(tmp_path, text) == said


def test_a_secret_key_of_a_wrong_type_still_hides_its_value(tmp_path: Path) -> None:
    said = refused(tmp_path, '[[target]]\nname = "db"\nkind = "postgresql"\ndsn = 12345678\n')
    assert said == "line 4: [[target]] #1 dsn: expected a string, got a whole number"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('smtp.listen = "x"\n', "line 1: [smtp] listen: 'x' is not host:port"),
        ('log.level = "x"\n', 'line 1: [log] level: expected one of "debug"'),
        ('[http]\nlisten = "127.0.0.1:8025"\nsmtp.listen = "x"\n', "line 3: [http] smtp: unknown key"),
        ('[spool]\npath = "s"\n\n[smtp]\n"max_line_length" = 10\n', "line 5: [smtp] max_line_length: must be at"),
        ('[[route]]\ndomain = "a"\ntls.x = 1\n', "line 3: [[route]] #1 tls: expected"),
    ],
    ids=["top-level", "enum", "in-a-section", "quoted", "in-a-block"],
)
def test_a_dotted_key_gets_the_line_it_is_written_on(tmp_path: Path, text: str, said: str) -> None:
    # Found from outside: `smtp.listen = "x"` at the top got no line; `[smtp] listen = "x"` did.
    assert refused(tmp_path, text).startswith(said)
