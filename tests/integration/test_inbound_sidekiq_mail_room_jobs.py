"""`arguments = "raw"`: a Sidekiq target pushes mail_room's job shape, `args: [raw]`, so that a
worker written for mail_room (GitLab's EmailReceiverWorker, `def perform(raw)`) runs Pigeon's
jobs unchanged; two arguments failed every job ("wrong number of arguments (given 2, expected
1)"). Mail that is not UTF-8 goes as its bytes read as Latin-1 (lossless: the worker can get
them back), said in the log, not as base64 the worker could not tell from mail."""

from __future__ import annotations

import json
import shutil
import smtplib
import subprocess
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.services import RedisServer

UTF8 = "From: client@example.com\r\nSubject: caf\u00e9\r\n\r\nHello.\r\n".encode()
LATIN1 = b"From: client@example.com\r\nSubject: caf\xe9\r\n\r\nVoil\xe0 ma question.\r\n"

# mail_room's worker, as GitLab's EmailReceiverWorker takes it: one argument. It says how many
# bytes it got, and their Latin-1 reading where they are not UTF-8.
_WORKER = """
require "json"
class EmailReceiverWorker
  def perform(raw)
    raw.valid_encoding? ? raw.bytesize : raw.encode("ISO-8859-1").bytesize
  end
end
STDIN.each_line do |line|
  job = JSON.parse(line)
  begin
    size = EmailReceiverWorker.new.perform(*job["args"])
    puts "ok #{size} #{job["args"][0].encode("ISO-8859-1").unpack1("H*") rescue "-"}"
  rescue ArgumentError => e
    puts "failed #{e.message}"
  end
end
"""


def _run_jobs(jobs: list[bytes]) -> list[str]:
    """Each job run by mail_room's worker (in Ruby, as Sidekiq runs it): what it said."""
    ruby = shutil.which("ruby")
    if ruby is None:
        pytest.skip("no ruby")
    done = subprocess.run(
        [ruby, "-e", _WORKER], input=b"\n".join(jobs) + b"\n", capture_output=True, timeout=60, check=True
    )
    return done.stdout.decode().splitlines()


def _jobs(node_arguments: str | None, tmp_path: Path, redis_server: RedisServer) -> tuple[list[bytes], str]:
    target = {"name": "jobs", "kind": "sidekiq", "redis_url": redis_server.url, "queue": "mail"}
    if node_arguments is not None:
        target["arguments"] = node_arguments
    node = PigeonProcess(
        tmp_path / "p",
        delivery={"enabled": True, "retry_interval": "1s"},
        target=[target],
        inbound=[{"domain": "app.example", "target": "jobs"}],
    )
    with node, smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
        client.sendmail("client@example.com", ["a@app.example"], UTF8)
        client.sendmail("client@example.com", ["a@app.example"], LATIN1, mail_options=["BODY=8BITMIME"])
        node.wait_records("Delivery", 2, timeout=20)
        redis = redis_server.client()
        jobs = list(reversed(redis.lrange("queue:mail", 0, -1)))
        redis.close()
        stderr = node.stderr()
    return jobs, stderr


def test_a_mail_room_worker_runs_the_jobs_of_a_target_with_arguments_raw(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    jobs, stderr = _jobs("raw", tmp_path, redis_server)
    args = [json.loads(job)["args"] for job in jobs]
    assert [len(a) for a in args] == [1, 1], args
    # Each message as it came, after the Received field the node adds.
    assert args[0][0].endswith(UTF8.decode()) and args[1][0].encode("latin-1").endswith(LATIN1)
    said = _run_jobs(jobs)
    assert [line.split()[0] for line in said] == ["ok", "ok"], said
    assert said[1].split()[2].endswith(LATIN1.hex()), said  # the bytes back, none lost
    assert "INFO pigeon.inbound.targets.sidekiq: target jobs: message" in stderr
    assert "is not UTF-8 (byte 0xe9 at offset" in stderr and 'arguments = "raw" pushes its bytes as Latin-1' in stderr


def test_the_default_job_shape_is_raw_and_metadata(tmp_path: Path, redis_server: RedisServer) -> None:
    jobs, _ = _jobs(None, tmp_path, redis_server)
    assert [len(json.loads(job)["args"]) for job in jobs] == [2, 2]
    said = _run_jobs(jobs)
    assert said[0] == "failed wrong number of arguments (given 2, expected 1)", said
