"""`pigeon logs` over segments damaged on disk (or by hand): the records that can be read are
shown, and what cannot is said on stderr, never passed to stdout (where it would break a
`jq` reading the records) nor left out without a word."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

from tests.support import zygote


def _record(n: int) -> bytes:
    return json.dumps({"type": "Reception", "id": f"{n:016x}", "timestamp": 1_800_000_000.0 + n}).encode()


def _logs(directory: Path) -> subprocess.CompletedProcess[str]:
    return zygote.run(["logs", "--dir", str(directory)], text=True, timeout=60)


def test_a_line_that_is_no_record_is_left_out_of_stdout_and_named_on_stderr(tmp_path: Path) -> None:
    (tmp_path / "20270115-000000-000000-w0.jsonl").write_bytes(
        _record(1) + b"\n" + b"garbage \x1b[31m not json\n" + _record(2) + b"\n"
    )
    result = _logs(tmp_path)
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == [f"{1:016x}", f"{2:016x}"]
    warning = "pigeon: warning: a line of the log is no JSON record, left out: garbage \\x1b[31m not json"
    assert warning in result.stderr


def test_a_compressed_segment_cut_short_is_read_up_to_the_cut_and_said_to_be_damaged(tmp_path: Path) -> None:
    whole = gzip.compress(b"".join(_record(n) + b"\n" for n in range(200)))
    cut = tmp_path / "20270115-000000-000000-w0.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    (tmp_path / "20270115-000001-000000-w0.jsonl").write_bytes(_record(500) + b"\n")
    result = _logs(tmp_path)
    assert result.returncode == 0, result.stderr
    shown = [json.loads(line)["id"] for line in result.stdout.splitlines()]
    assert shown[-1] == f"{500:016x}"  # the segments after it are read
    assert 0 < len(shown) - 1 < 200
    assert f"pigeon: warning: log segment {cut} is damaged" in result.stderr
