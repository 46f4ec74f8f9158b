"""The admin API of a node that only receives (`[delivery] enabled = false`): the token is
checked first, as everywhere in the API, so a caller without one learns 401 and one without
the scope 403. Reads show what its spool holds; a write is refused, 503 saying why, and the
`pigeon` command exits 75 (the node cannot do it now), not 2 (fix the command)."""

from __future__ import annotations

import smtplib
from collections.abc import Iterator

import pytest

from tests.integration.test_cli import pigeon_cli
from tests.support.process import PigeonProcess

ADMIN = "admin-token-0123456789"
READER = "reader-token-0123456789"
TOKENS = [
    {"name": "ops", "token": ADMIN, "scopes": ["admin", "read"]},
    {"name": "dashboard", "token": READER, "scopes": ["read"]},
]
DISABLED = "delivery is disabled on this node ([delivery] enabled = false)"
NO_WRITES = (
    f"{DISABLED}: it keeps its spool as it is, and takes no bounce, suspend, resume, retry or rebind "
    "(reads answer: queues, messages, standing rules); to act on its mail, enable delivery and restart it"
)


@pytest.fixture(scope="module", params=[1, 2], ids=["one-worker", "two-workers"])
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    """A node that does not deliver: one worker answers itself, two answer through the supervisor."""
    root = tmp_path_factory.mktemp("receive-only") / "node"
    with PigeonProcess(root, node={"workers": request.param}, http={"token": TOKENS}) as pigeon:
        yield pigeon


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("GET", "/api/v1/queues", None), ("POST", "/api/v1/admin/bounce", {"queue": "example.net"})],
)
def test_a_request_without_a_token_gets_401_not_503(
    node: PigeonProcess, method: str, path: str, body: dict[str, str] | None
) -> None:
    status, answer = node.http_call(method, path, body)
    assert status == 401, answer
    assert "Authorization: Bearer" in answer["error"]


def test_a_read_only_token_on_an_admin_write_gets_403_not_503(node: PigeonProcess) -> None:
    status, answer = node.http_call("POST", "/api/v1/admin/bounce", {"queue": "example.net"}, READER)
    assert status == 403, answer
    assert answer["error"] == "token 'dashboard' lacks the 'admin' scope"


def test_a_write_with_the_scope_learns_that_the_node_does_not_deliver(node: PigeonProcess) -> None:
    for method, path, body in [
        ("POST", "/api/v1/admin/bounce", {"queue": "example.net"}),
        ("POST", "/api/v1/admin/suspend", {"queue": "example.net"}),
        ("POST", "/api/v1/admin/retry", {"queue": "example.net"}),
        ("POST", "/api/v1/admin/rebind", {"queue": "example.net", "to_queue": "other"}),
        ("DELETE", "/api/v1/admin/suspend/3f9a1c2b7d4e", None),
    ]:
        status, answer = node.http_call(method, path, body, ADMIN)
        assert (status, answer["error"]) == (503, NO_WRITES), (method, path, answer)


def test_reads_show_what_the_spool_holds_and_writes_exit_75(node: PigeonProcess) -> None:
    with smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
        client.sendmail("a@example.org", ["held@example.com"], b"From: a@example.org\r\nSubject: x\r\n\r\nhi\r\n")
    (message,) = [m for m in node.spool_messages() if m["queue"] == "example.com"]
    status, answer = node.http_call("GET", "/api/v1/queues", None, READER)
    assert status == 200, answer
    (row,) = [row for row in answer["scheduled"] if row["queue"] == "example.com"]
    assert (row["messages"], row["due"], row["ready"], row["in_flight"]) == (1, 1, 0, 0)
    assert answer["ready"] == []
    config = ["-c", str(node.config_path), "--token", READER]
    summary = pigeon_cli("queue", "summary", *config)
    assert summary.returncode == 0, summary.stderr
    assert any(line.split()[:3] == ["example.com", "1", "1"] for line in summary.stdout.splitlines()), summary.stdout
    shown = pigeon_cli("inspect", *config, message["id"])
    assert shown.returncode == 0, shown.stderr
    assert "held@example.com" in shown.stdout and "example.com" in shown.stdout
    operations = pigeon_cli("queue", "operations", *config)
    assert operations.returncode == 0, operations.stderr
    rules = pigeon_cli("suspend", "--list", *config)
    assert (rules.returncode, rules.stdout.strip()) == (0, "none"), rules.stderr
    top = pigeon_cli("top", "--once", *config, columns=200)
    assert top.returncode == 0, top.stderr
    assert any(line.split()[:2] == ["example.com", "1"] for line in top.stdout.splitlines()), top.stdout
    assert "no queues" not in top.stdout
    admin = ["-c", str(node.config_path), "--token", ADMIN]
    for write in (
        ["bounce", "--domain", "example.com"],
        ["suspend", "--domain", "example.com"],
        ["retry", "--domain", "example.com"],
        ["resume", "3f9a1c2b7d4e"],
    ):
        refused = pigeon_cli(*write, *admin)
        assert refused.returncode == 75, (write, refused.stdout, refused.stderr)
        assert refused.stderr == f"pigeon: 503: {NO_WRITES}\n", write
    assert [m["id"] for m in node.spool_messages() if m["queue"] == "example.com"] == [message["id"]]


def test_a_read_for_the_cluster_of_a_node_without_redis_is_its_own(node: PigeonProcess) -> None:
    """As on a node that delivers: without [redis] there is no cluster, and the node answers for itself."""
    status, answer = node.http_call("GET", "/api/v1/queues?cluster=1", None, READER)
    assert status == 200, answer
    assert "cluster" not in answer


def test_the_node_says_at_start_that_it_does_not_deliver(node: PigeonProcess) -> None:
    # It said nothing: a node started with delivery off looked like one that delivers.
    said = node.wait_stderr("delivery is off ([delivery] enabled = false)")
    lines = [line for line in said.splitlines() if "delivery is off" in line]
    assert len(lines) == 1 and "WARNING" in lines[0], lines  # once for the node, whatever its workers
    assert "accepted and spooled, and none delivered" in lines[0]
