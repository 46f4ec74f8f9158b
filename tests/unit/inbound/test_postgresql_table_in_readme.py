"""The README's CREATE TABLE for the PostgreSQL target is the one Pigeon runs (`create_table`),
column for column, so that a table made by hand from it takes Pigeon's rows: the two cannot
drift apart unnoticed."""

from __future__ import annotations

import re

from pigeon.inbound.targets.postgresql import create_table_sql
from tests.support.readme import readme_sql


def _bare(sql: str) -> str:
    """SQL without its comments, its white space made single spaces."""
    return " ".join(re.sub(r"--[^\n]*", "", sql).split())


def test_the_readmes_create_table_is_the_one_pigeon_runs() -> None:
    assert _bare(readme_sql("CREATE TABLE")) == _bare(create_table_sql("inbound_emails"))
