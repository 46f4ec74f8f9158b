"""A value a config error names is shown as the TOML file writes it, not as Python prints it:
`[true]`, not `[True]`; `2024-01-01`, not `datetime.date(2024, 1, 1)`; `-inf`, `nan`."""

from __future__ import annotations

import math
import tomllib
from typing import Any

import pytest

from pigeon.config.schema import toml_spelling

WRITTEN = [
    "true",
    "false",
    "0",
    "-17",
    "1.5",
    "-0.0",
    "1e+300",
    "1e-07",
    "inf",
    "-inf",
    "nan",
    '"x"',
    '"say \\"hi\\"\\n\\tthen\\\\go"',
    '"é\\u0001"',
    "2024-01-01",
    "07:32:00",
    "07:32:00.25",
    "1979-05-27T07:32:00",
    "1979-05-27T07:32:00Z",
    "1979-05-27T00:32:00.999999-07:00",
    "[]",
    "[true, 1, -inf, 2024-01-01]",
    '[[true], { a = false }, "s"]',
    "{}",
    '{ a = 1, "b c" = [true], d = { e = nan } }',
]


def _same(read: Any, again: Any) -> bool:
    if isinstance(read, float) and math.isnan(read):
        return isinstance(again, float) and math.isnan(again)
    if isinstance(read, list):
        return isinstance(again, list) and len(read) == len(again) and all(map(_same, read, again))
    if isinstance(read, dict):
        return isinstance(again, dict) and read.keys() == again.keys() and all(_same(read[k], again[k]) for k in read)
    return type(read) is type(again) and read == again


@pytest.mark.parametrize("written", WRITTEN)
def test_a_toml_value_is_spelt_as_the_file_wrote_it_and_reads_back_the_same(written: str) -> None:
    read = tomllib.loads(f"v = {written}")["v"]
    spelt = toml_spelling(read)
    assert _same(tomllib.loads(f"v = {spelt}")["v"], read), spelt
    if written != '"é\\u0001"':  # (a character TOML may write as it is or escaped: either reads back)
        assert spelt == written


def test_a_utc_offset_written_as_zeros_is_spelt_z_which_reads_back_the_same() -> None:
    read = tomllib.loads("v = 1979-05-27T07:32:00+00:00")["v"]
    assert toml_spelling(read) == "1979-05-27T07:32:00Z"
