"""The admin API of a node that only receives (`[delivery] enabled = false`): the token is
checked first, as everywhere in the API, so a caller without one learns 401 and one without
the scope 403, and only one who may ask learns that the node does not deliver (503)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.process import PigeonProcess

ADMIN = "admin-token-0123456789"
READER = "reader-token-0123456789"
TOKENS = [
    {"name": "ops", "token": ADMIN, "scopes": ["admin", "read"]},
    {"name": "dashboard", "token": READER, "scopes": ["read"]},
]
DISABLED = "delivery is disabled on this node ([delivery] enabled = false)"


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


@pytest.mark.parametrize(
    ("method", "path", "body", "token"),
    [
        ("GET", "/api/v1/queues", None, READER),
        ("POST", "/api/v1/admin/bounce", {"queue": "example.net"}, ADMIN),
    ],
)
def test_a_token_with_the_scope_learns_that_the_node_does_not_deliver(
    node: PigeonProcess, method: str, path: str, body: dict[str, str] | None, token: str
) -> None:
    status, answer = node.http_call(method, path, body, token)
    assert status == 503, answer
    assert answer["error"] == DISABLED
