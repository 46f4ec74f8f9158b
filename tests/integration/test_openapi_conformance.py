"""The OpenAPI document against the live server: schemathesis generates requests from the
document and checks every answer (no 5xx, documented status codes and content types, bodies
that match their schemas, schema-valid requests accepted, invalid ones refused)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

TOKEN = "conformance-token-0123456789"


def _schemathesis(pigeon: PigeonProcess, *options: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert binary, "schemathesis is a test dependency: ./scripts/test installs it"
    command = [
        binary, "run", f"http://127.0.0.1:{pigeon.http_port}/api/openapi.json",
        "--header", f"Authorization: Bearer {TOKEN}",
        "--checks", "all", "--suppress-health-check", "all", "--seed", "7", "--no-color", *options,
    ]  # fmt: skip
    # Its working directory gets its cache (.schemathesis/): the node's, not the checkout.
    return subprocess.run(command, capture_output=True, text=True, timeout=900, check=False, cwd=pigeon.root)


def _node(root: Path, sink: ScriptedSink) -> PigeonProcess:
    tokens = [{"name": "conformance", "token": TOKEN, "scopes": ["inject", "admin", "read"]}]
    return PigeonProcess(root, http={"token": tokens}, log={"level": "warning"}, **delivery_config(sink.endpoint))


# About a minute of schemathesis's CPU alone; on a 2-core runner shared with 3 other test
# workers it took 285 s, so the usual 300 s would fail it for the machine's load, not for Pigeon.
@pytest.mark.timeout(900)
def test_the_api_answers_as_its_openapi_document_says(tmp_path: Path) -> None:
    with ScriptedSink() as sink, _node(tmp_path / "node", sink) as pigeon:
        result = _schemathesis(pigeon, "--phases", "fuzzing", "--max-examples", "3")
    assert result.returncode == 0, result.stdout[-6000:]
    assert "Tested: 14" in result.stdout  # every operation of the document was exercised


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_api_answers_as_its_openapi_document_says_at_length(tmp_path: Path) -> None:
    with ScriptedSink() as sink, _node(tmp_path / "node", sink) as pigeon:
        result = _schemathesis(pigeon, "--phases", "coverage,fuzzing,stateful", "--max-examples", "40")
    assert result.returncode == 0, result.stdout[-6000:]
