"""Which node a `pigeon` command asks, with which token, and what it says when that goes wrong.

The token a command takes by itself is the local one of the spool it reads (`-c FILE`'s
`[spool] path`, else `./var/spool`): that spool's node is the one that knows it, and the node
writes where it listens to the spool's `http-address`. The command asked `[http] listen` (the
default 127.0.0.1:8025 without `-c`) first, and the recorded address only when that one did
not answer: another node answering there got this spool's token and said `401: unknown
token`. A command that found no token at all sent none, and said only the node's bare 401.
README: "The commands find the node and the local token"."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess, to_toml

_ENV = {name: value for name, value in os.environ.items() if name != "PIGEON_TOKEN"}


def _pigeon(*args: str, cwd: Path) -> tuple[int, str, str]:
    result = zygote.run([*args], text=True, cwd=cwd, timeout=60, env=_ENV)
    return result.returncode, result.stdout, result.stderr


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PigeonProcess, PigeonProcess]]:
    """Two nodes: `ours`, whose spool is `var/spool` under its directory (the default path, as
    `pigeon serve` without -c keeps it), and `other`, on another spool and port."""
    root = tmp_path_factory.mktemp("cli-finds")
    with (
        PigeonProcess(root / "ours", spool={"path": "var/spool"}) as ours,
        PigeonProcess(root / "other") as other,
    ):
        yield ours, other


def test_without_c_a_command_asks_the_node_whose_spool_holds_its_token(
    nodes: tuple[PigeonProcess, PigeonProcess],
) -> None:
    """In the node's directory, no -c: the default spool's token, and its node's address."""
    ours, _ = nodes
    status, out, err = _pigeon("queue", "summary", "--json", cwd=ours.root)
    assert (status, err) == (0, "")
    assert isinstance(json.loads(out), dict)


def test_a_command_asks_the_spool_s_node_not_another_on_the_configured_address(
    nodes: tuple[PigeonProcess, PigeonProcess], tmp_path: Path
) -> None:
    """The configuration's `[http] listen` names an address another node holds (edited since
    this spool's node started, which keeps listening where it did): the command asks this
    spool's node, whose token it sends, not the other one."""
    ours, other = nodes
    edited = json.loads(json.dumps(ours.config))
    edited["http"]["listen"] = f"127.0.0.1:{other.http_port}"
    edited["spool"]["path"] = str(ours.spool_path)
    config = tmp_path / "edited.toml"
    config.write_text(to_toml(edited))
    status, out, err = _pigeon("queue", "summary", "--json", "-c", str(config), cwd=tmp_path)
    assert (status, err) == (0, "")
    assert isinstance(json.loads(out), dict)


def test_a_command_that_found_no_token_says_where_it_looked_and_what_to_give(
    nodes: tuple[PigeonProcess, PigeonProcess], tmp_path: Path
) -> None:
    ours, _ = nodes
    status, _, err = _pigeon("queue", "summary", "--url", f"http://127.0.0.1:{ours.http_port}", cwd=tmp_path)
    assert status == 2
    assert err == (
        "pigeon: no token was sent: none was given (--token, $PIGEON_TOKEN), and without -c the local token is "
        f"looked for in ./var/spool/api-token ({tmp_path / 'var' / 'spool' / 'api-token'}): No such file or "
        "directory; give the node's configuration (-c FILE, as given to `pigeon serve`: its spool holds the local "
        "token) or --token\n"
        "pigeon: 401: send 'Authorization: Bearer <token>' (see [[http.token]]) (Authorization)\n"
    )


def test_a_local_token_another_node_refuses_is_said_to_be_the_spool_s(
    nodes: tuple[PigeonProcess, PigeonProcess],
) -> None:
    ours, other = nodes
    status, _, err = _pigeon("queue", "summary", "--url", f"http://127.0.0.1:{other.http_port}", cwd=ours.root)
    assert status == 2
    token = ours.root / "var" / "spool" / "api-token"
    assert err == (
        f"pigeon: the token sent is the local one of ./var/spool ({token}), which "
        f"http://127.0.0.1:{other.http_port} does not know: it is not that spool's node; give the node's "
        "configuration (-c FILE, as given to `pigeon serve`) or --token\n"
        "pigeon: 401: unknown token (Authorization)\n"
    )


def test_with_c_a_spool_without_a_local_token_is_named_with_what_to_give(
    nodes: tuple[PigeonProcess, PigeonProcess], tmp_path: Path
) -> None:
    """A configuration whose spool holds no token (`[http] local_token = false`, another user's
    spool, a node never started on it): the 401 is told of with the file looked for."""
    ours, _ = nodes
    config = tmp_path / "pigeon.toml"
    config.write_text(to_toml({"http": {"listen": f"127.0.0.1:{ours.http_port}"}, "spool": {"path": "spool"}}))
    status, _, err = _pigeon("queue", "summary", "-c", str(config), cwd=tmp_path)
    assert status == 2
    assert err == (
        f"pigeon: no token was sent: none was given (--token, $PIGEON_TOKEN), and the local token is looked for in "
        f"the spool of {config}, {tmp_path / 'spool' / 'api-token'}: No such file or directory (the node keeps it "
        "there while [http] local_token is on, for the user it runs as); give --token\n"
        "pigeon: 401: send 'Authorization: Bearer <token>' (see [[http.token]]) (Authorization)\n"
    )
