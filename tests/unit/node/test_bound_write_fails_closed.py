"""The supervisor confines a write of a token bound to tenants before any worker or node is
told, and fails closed: a write it cannot confine (a body `validate` refuses, a selector not
of its tenants, a token without the `admin` scope) is refused there, as a worker would refuse
it, and passed on to no worker and no node.

It used to pass such a write on unconfined, for each worker to refuse: as safe as every step
after its check. One step (`with_id` replacing `via`) made an invalid body valid after it, and
the other nodes carried out acme's bounce of globex's mail. Here, whatever a body is, what the
workers and the cluster are told of a bound token's write is one `validate` takes and `confine`
leaves as it is: a step added later that makes an invalid body valid fails these tests."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from pigeon.config.load import load_text
from pigeon.listener.http import admin
from pigeon.listener.http.admin import confine, validate
from pigeon.node import supervisor as supervising
from pigeon.node.supervisor import Supervisor

ACME = "acme-admin-0123456789"
READER = "acme-reader-0123456789"
CONFIG = f"""
[delivery]
enabled = false

[[http.token]]
name = "acme-admin"
token = "{ACME}"
scopes = ["admin", "read"]
tenants = ["acme"]

[[http.token]]
name = "acme-reader"
token = "{READER}"
scopes = ["read"]
tenants = ["acme"]
"""


class _Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.told: list[bytes] = []

    async def forward(self, request: web.Request, body: bytes, **_: Any) -> web.Response:
        self.told.append(body)
        return web.json_response({"bounced": 0, "after_attempt": 0})


class _Cluster:
    """The admin stream, as the supervisor uses it: what the other nodes would be told."""

    def __init__(self) -> None:
        self.told: list[bytes] = []

    async def around(
        self,
        method: str,
        path: str,
        body: bytes,
        operator: str,
        local: Callable[[], Awaitable[tuple[int, Any]]],
        **_: Any,
    ) -> tuple[int, Any]:
        self.told.append(body)
        return await local()


def _supervisor(tmp_path: Path, cluster: bool) -> tuple[Supervisor, list[_Worker], _Cluster]:
    config = load_text(CONFIG + f'\n[spool]\npath = "{tmp_path / "spool"}"\n', tmp_path / "pigeon.toml")
    supervisor = Supervisor(config, None, 2)
    workers = [_Worker(0), _Worker(1)]
    supervisor.workers = workers  # type: ignore[assignment]
    stream = _Cluster()
    if cluster:
        supervisor._cluster = stream  # type: ignore[assignment]
    return supervisor, workers, stream


async def _write(
    supervisor: Supervisor, path: str, body: bytes, token: str = ACME, content_type: str = "application/json"
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": content_type}
    response = await supervisor._broadcast(make_mocked_request("POST", path, headers=headers), body)
    assert isinstance(response, web.Response) and response.text is not None
    return response.status, json.loads(response.text)


REFUSED = [
    # What `validate` refuses: each was passed on before, for the workers to refuse.
    ("/api/v1/admin/bounce", {"domain": "*", "via": "curl"}, 400, "$.via"),
    ("/api/v1/admin/bounce", {"tenant": "globex", "via": {}}, 400, "$.via"),
    ("/api/v1/admin/bounce", {"domain": "*", "id": "not an id"}, 400, "$.id"),
    ("/api/v1/admin/bounce", {"tenant": "globex", "id": 5}, 400, "$.id"),
    ("/api/v1/admin/retry", {"domain": "*", "colour": "red"}, 400, "$.colour"),
    ("/api/v1/admin/suspend", {"domain": "*", "duration": "forever"}, 400, "$.duration"),
    ("/api/v1/admin/bounce", [1, 2], 400, "$"),
    # What `confine` refuses.
    ("/api/v1/admin/bounce", {"tenant": "globex"}, 403, "$.tenant"),
    ("/api/v1/admin/suspend", {"site": "mx.example.net"}, 403, "$.site"),
    ("/api/v1/admin/rebind", {"domain": "*", "to_queue": "vip"}, 403, "$.to_queue"),
]


@pytest.mark.parametrize("cluster", [False, True], ids=["node", "cluster"])
@pytest.mark.parametrize(("path", "body", "status", "field"), REFUSED)
async def test_a_bound_tokens_write_that_cannot_be_confined_is_refused_by_the_supervisor_and_passed_on_to_none(
    tmp_path: Path, cluster: bool, path: str, body: Any, status: int, field: str
) -> None:
    supervisor, workers, stream = _supervisor(tmp_path, cluster)
    got, answer = await _write(supervisor, path, json.dumps(body).encode())
    assert (got, answer["field"]) == (status, field), answer
    assert [worker.told for worker in workers] == [[], []]
    assert stream.told == []


@pytest.mark.parametrize("cluster", [False, True], ids=["node", "cluster"])
async def test_a_bound_tokens_write_refused_for_its_token_or_its_content_type_is_passed_on_to_none(
    tmp_path: Path, cluster: bool
) -> None:
    supervisor, workers, stream = _supervisor(tmp_path, cluster)
    body = json.dumps({"tenant": "globex"}).encode()
    status, answer = await _write(supervisor, "/api/v1/admin/bounce", body, token=READER)
    assert (status, answer) == (403, {"error": "token 'acme-reader' lacks the 'admin' scope", "field": "Authorization"})
    status, answer = await _write(supervisor, "/api/v1/admin/bounce", body, content_type="text/plain")
    assert (status, answer["field"]) == (415, "Content-Type"), answer
    assert [worker.told for worker in workers] == [[], []]
    assert stream.told == []


def _confined(body: bytes, path: str) -> None:
    """`body` as every worker and node may carry it out: valid, and as confined as it can be."""
    validate("POST", path, body)
    assert json.loads(confine("POST", path, body, "acme-admin", frozenset({"acme"}), lambda _: None)) == json.loads(
        body
    )
    decoded = json.loads(body)
    assert (decoded["tenant"], decoded["bound_to"]) == ("acme", ["acme"]), decoded


@pytest.mark.parametrize("cluster", [False, True], ids=["node", "cluster"])
@pytest.mark.parametrize(
    "body",
    [
        {"domain": "*"},
        {"tenant": "acme", "domain": "x.test", "id": "mine"},
        {"domain": "*", "id": None},
        {"domain": "*", "via": "curl"},  # valid only once a step replaced `via`: see below
        {"domain": "*", "bound_to": None},
    ],
)
async def test_what_the_workers_and_the_nodes_are_told_of_a_bound_tokens_write_is_confined_whatever_was_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: bool, body: Any
) -> None:
    # A step that makes an invalid body valid (as `with_id` made `"via": "curl"` "api"): the
    # body it makes is checked and confined, not the one the client sent.
    def made_valid(body: bytes, via: Any = None, bound: Any = None) -> bytes:
        decoded = json.loads(body)
        decoded["via"] = "api"
        return admin.with_id(json.dumps(decoded).encode(), via, bound)

    monkeypatch.setattr(supervising, "with_id", made_valid)
    supervisor, workers, stream = _supervisor(tmp_path, cluster)
    status, answer = await _write(supervisor, "/api/v1/admin/bounce", json.dumps(body).encode())
    assert status == 200, answer
    told = [*workers[0].told, *workers[1].told, *stream.told]
    assert len(told) == (3 if cluster else 2) and len(set(told)) == 1, told
    _confined(told[0], "/api/v1/admin/bounce")
