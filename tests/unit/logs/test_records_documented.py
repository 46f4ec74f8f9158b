"""README's table of event log records names every field each record type may carry: a
consumer reading a record meets no member the documentation is silent about (`meta`, the
metadata an application injected, was one)."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from pigeon.logs import records

README = Path(__file__).resolve().parents[3] / "README.md"
_ROW = re.compile(r"\| `(\w+)` \| .*? \| (.*) \|$")
_ALWAYS = frozenset({"type", "timestamp", "node"})


def _documented() -> dict[str, set[str]]:
    """Each record type's fields as README's table names them, with those of the types its
    row refers to ("as `Delivery`")."""
    rows = {m.group(1): m.group(2) for line in README.read_text().splitlines() if (m := _ROW.match(line))}
    fields = {}
    for name, row in rows.items():
        named = set(re.findall(r"`(\w+)`", row))
        for base in re.findall(r"as `(\w+)`", row):
            named |= set(re.findall(r"`(\w+)`", rows.get(base, "")))
        fields[name] = named
    return fields


@pytest.mark.parametrize("kind", records.RECORD_TYPES, ids=lambda kind: kind.__struct_config__.tag)
def test_readme_names_every_field_of_each_record_type(kind: type[records.Record]) -> None:
    tag = kind.__struct_config__.tag
    documented = _documented()
    assert tag in documented, f"README's record table has no row for {tag}"
    written = {field.encode_name for field in msgspec.structs.fields(kind)} - _ALWAYS
    assert written - documented[tag] == set()
