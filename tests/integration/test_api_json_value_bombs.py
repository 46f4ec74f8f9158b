"""A request body small on the wire but made of millions of JSON values (61 KB of gzip are 21
million `{}`) is refused before anything decodes it, and the node goes on serving meanwhile:
an inject token (or a tenant's admin token) must not be able to hold a worker's loop, or the
supervisor's, for minutes, nor get a worker killed for not answering its heartbeat."""

from __future__ import annotations

import gzip
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import delivery_config

VALUES = 5_000_000  # 15 MB decoded, 15 KB of gzip: seconds of Python per request before the fix


def _post_gzip(pigeon: PigeonProcess, path: str, raw: bytes) -> tuple[int, dict[str, object], float]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{pigeon.http_port}{path}",
        data=gzip.compress(raw, 9),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
            "Authorization": f"Bearer {pigeon.local_token}",
        },
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            status, body = answer.status, answer.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    return status, json.loads(body), time.monotonic() - started


def _greeting_delays(port: int, stop: threading.Event, delays: list[float]) -> None:
    while not stop.is_set():
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=60) as client:
            client.settimeout(60)
            client.recv(512)
            delays.append(time.monotonic() - started)
            client.sendall(b"QUIT\r\n")
        time.sleep(0.05)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_injection_of_millions_of_json_values_is_refused_at_once_and_smtp_is_served_meanwhile(
    tmp_path: Path, workers: int
) -> None:
    with PigeonProcess(tmp_path / "node", node={"workers": workers}) as pigeon:
        assert pigeon.process is not None
        raw = b'{"x":[' + b",".join([b"{}"] * VALUES) + b"]}"
        stop, delays = threading.Event(), list[float]()
        prober = threading.Thread(target=_greeting_delays, args=(pigeon.smtp_port, stop, delays))
        prober.start()
        spent = _session_cpu(pigeon.process.pid)
        try:
            status, answer, took = _post_gzip(pigeon, "/api/v1/inject", raw)
        finally:
            spent = _session_cpu(pigeon.process.pid) - spent
            stop.set()
            prober.join()
        assert (status, answer["field"]) == (400, "$"), answer
        assert "more than 1000000 JSON values in one request" in str(answer["error"])
        # Refused at once: a fraction of a CPU second in the node's processes (0.13 s measured),
        # where decoding the values took seconds. CPU, not time, so a loaded machine (the
        # suite's six workers on two cores) cannot fail it; the waits below are bounded loosely
        # for the same reason (a loop held for the decoding held the greeting as long).
        assert spent < 1.5, spent
        assert took < 10, took
        assert max(delays) < 5, delays
        assert "killing it" not in pigeon.stderr()


def _session_cpu(session: int) -> float:
    """CPU seconds of the processes of a node's session (its supervisor and workers) so far."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # (gone meanwhile)
                continue
            if int(fields[3]) == session:  # (its session id; fields[0] is its state)
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def test_a_json_value_bomb_among_substitutions_is_refused_too(tmp_path: Path) -> None:
    """A body the schema would take (substitutions hold any JSON) is refused alike."""
    with PigeonProcess(tmp_path / "node") as pigeon:
        raw = (
            b'{"envelope_sender":"a@example.org","recipients":[{"email":"b@example.net"}],'
            b'"content":{"from":{"email":"a@example.org"},"subject":"s","text":"t"},"substitutions":{"x":['
            + b",".join([b"1"] * VALUES)
            + b"]}}"
        )
        status, answer, took = _post_gzip(pigeon, "/api/v1/inject", raw)
        assert status == 400, answer
        assert "more than 1000000 JSON values" in str(answer["error"])
        assert took < 5, took
        assert pigeon.spool_messages() == []


@pytest.mark.parametrize("workers", [1, 2])
def test_an_admin_body_over_64_kib_is_refused_before_it_is_decoded(tmp_path: Path, workers: int) -> None:
    config = delivery_config("127.0.0.1:9")  # (delivery on: a node without takes no admin write at all)
    with PigeonProcess(tmp_path / "node", node={"workers": workers}, **config) as pigeon:
        raw = b'{"domain":"x.test","reason":"r","x":[' + b",".join([b"{}"] * VALUES) + b"]}"
        status, answer, took = _post_gzip(pigeon, "/api/v1/admin/suspend", raw)
        refused = {"error": "an admin request's body is at most 65536 bytes", "field": "$"}
        assert (status, answer) == (413, refused), answer
        assert took < 5, took
        status, listed = pigeon.http_call("GET", "/api/v1/admin/suspend", token=pigeon.local_token)
        assert status == 200 and "x.test" not in json.dumps(listed)  # nothing was made of it
