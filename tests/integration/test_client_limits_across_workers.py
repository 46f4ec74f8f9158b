"""Per-client limits hold for the node, not per worker: a node of two workers gives one client
`max_connections_per_client` connections and `auth_failures_per_address` guesses in total,
whichever worker the kernel hands each connection to, and a worker killed with SIGKILL leaves
nothing counted once the supervisor has restarted it.

Which worker holds a connection is read from /proc (the server side's socket inode among the
worker's descriptors), so each test can show that both workers took part.
"""

from __future__ import annotations

import base64
import os
import signal
import smtplib
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from pigeon.listener.passwords import set_password
from tests.support.process import PigeonProcess

CLIENT = "127.0.0.7"  # not the readiness probe's 127.0.0.1, and outside relay_networks
NOT_LOOPBACK = {"relay_networks": ["192.0.2.0/24"]}
LIMIT = 4
TOO_MANY = b"421 mx.pigeon.test too many connections from your address, try again later"


def _node(root: Path, **smtp: object) -> PigeonProcess:
    return PigeonProcess(root, node={"workers": 2}, smtp={**NOT_LOOPBACK, **smtp})


def _worker_of(pids: list[int], server_port: int, client: socket.socket) -> int:
    """The index of the worker holding the server side of `client`'s connection."""
    client_port = client.getsockname()[1]
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
            inode = fields[9]
    assert inode is not None, f"no server socket for client port {client_port}"
    for index, pid in enumerate(pids):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) == f"socket:[{inode}]":
                    return index
            except OSError:
                continue
    raise AssertionError(f"no worker holds socket {inode}")


def _connect(port: int) -> tuple[socket.socket, bytes]:
    """A connection from CLIENT and its greeting line."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(CLIENT, 0))
    return sock, sock.makefile("rb").readline().rstrip()


@contextmanager
def _crowd(port: int, count: int) -> Iterator[list[tuple[socket.socket, bytes]]]:
    """`count` connections from CLIENT, kept open: each with its greeting."""
    with ExitStack() as stack:
        crowd = []
        for _ in range(count):
            sock, greeting = _connect(port)
            stack.enter_context(sock)
            crowd.append((sock, greeting))
        yield crowd


def _accepted(crowd: list[tuple[socket.socket, bytes]]) -> list[socket.socket]:
    return [sock for sock, greeting in crowd if greeting.startswith(b"220 ")]


@contextmanager
def _full_crowd(
    port: int, count: int, limit: int, deadline: float = 5.0
) -> Iterator[list[tuple[socket.socket, bytes]]]:
    """`_crowd`, come again while fewer than `limit` got in: right after an earlier crowd left,
    the node may not have seen all of its connections close yet. More than `limit` fails at once."""
    end = time.monotonic() + deadline
    while True:
        with _crowd(port, count) as crowd:
            accepted = len(_accepted(crowd))
            assert accepted <= limit, [greeting for _, greeting in crowd]
            if accepted == limit or time.monotonic() > end:
                yield crowd
                return
        time.sleep(0.1)


def _open_until_refused(port: int, stack: ExitStack, deadline: float = 5.0) -> int:
    """Connections CLIENT may still open: opened (and kept) until one is refused. A refusal
    right after a close may be the close not yet seen by the node: tried again for a while."""
    opened = 0
    end = time.monotonic() + deadline
    while True:
        sock, greeting = _connect(port)
        if greeting.startswith(b"220 "):
            stack.enter_context(sock)
            opened += 1
            continue
        sock.close()
        assert greeting == TOO_MANY
        if opened or time.monotonic() > end:
            return opened
        time.sleep(0.1)


def test_one_client_gets_the_connection_limit_from_the_node_whichever_worker_accepts(tmp_path: Path) -> None:
    with _node(tmp_path / "node", max_connections_per_client=LIMIT) as pigeon:
        # The workers share one listening socket: which one accepts a connection is the
        # kernel's choice, so a crowd may now and then all go to one. It comes again until
        # both have refused some, and the node's limit must hold every time.
        for crowds in range(1, 21):  # (on a busy machine, one worker may take several crowds whole)
            with _full_crowd(pigeon.smtp_port, 2 * LIMIT + 6, LIMIT) as crowd:
                accepted = _accepted(crowd)
                assert len(accepted) == LIMIT, [greeting for _, greeting in crowd]
                assert [greeting for _, greeting in crowd].count(TOO_MANY) == LIMIT + 6

                # A connection that ends gives its place back, to whichever worker takes the next.
                accepted[0].sendall(b"QUIT\r\n")
                accepted[0].recv(1024)
                with ExitStack() as stack:
                    assert _open_until_refused(pigeon.smtp_port, stack) == 1

            wanted = crowds * (LIMIT + 6)
            rejections = [r for r in pigeon.wait_records("Rejection", wanted) if r["command"] == "CONNECT"]
            assert len(rejections) >= wanted
            assert {r["response"]["code"] for r in rejections} == {421}
            # Both workers refused some: each refuses once the node, not it, holds the limit. (A
            # session id starts with its process's own prefix.)
            if len({r["session"][:8] for r in rejections}) == 2:
                break
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # every place given back before the next crowd
                with ExitStack() as stack:
                    if _open_until_refused(pigeon.smtp_port, stack) == LIMIT:
                        break
                time.sleep(0.1)
        assert len({r["session"][:8] for r in rejections}) == 2


def test_a_worker_killed_with_sigkill_leaves_no_phantom_connections_once_restarted(tmp_path: Path) -> None:
    with _node(tmp_path / "node", max_connections_per_client=LIMIT) as pigeon:
        pids = pigeon.shard_owners()
        # Open the limit; kill a worker that holds some of them (try again until both do).
        while True:
            crowd = [_connect(pigeon.smtp_port) for _ in range(LIMIT)]
            assert all(greeting.startswith(b"220 ") for _, greeting in crowd)
            holders = [_worker_of(pids, pigeon.smtp_port, sock) for sock, _ in crowd]
            if set(holders) == {0, 1}:
                break
            for sock, _ in crowd:
                sock.close()
            time.sleep(0.2)
        with ExitStack() as stack:
            for sock, _ in crowd:
                stack.enter_context(sock)
            os.kill(pids[1], signal.SIGKILL)
            survivors = holders.count(0)
            deadline = time.monotonic() + 20
            while pigeon.shard_owners()[1] == pids[1] or not _serving(pigeon):
                assert time.monotonic() < deadline, "worker 1 was not restarted"
                time.sleep(0.1)
            # Worker 1's connections died with it; the client may open them again.
            assert _open_until_refused(pigeon.smtp_port, stack) == LIMIT - survivors


def _serving(pigeon: PigeonProcess) -> bool:
    status, _ = pigeon.http_get("/healthz")
    return status == 200


# --- AUTH lockout -------------------------------------------------------------------------------
PASSWORD = "wonderland"
LOCKED_OUT = (454, b"4.7.0 Too many failed authentication attempts, try again later")
WRONG = (535, b"5.7.8 Authentication credentials invalid")


def _auth(port: int, pids: list[int], password: str) -> tuple[tuple[int, bytes], int]:
    """One AUTH PLAIN as alice on a fresh STARTTLS connection from CLIENT: the reply, and the
    worker that gave it."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with smtplib.SMTP("127.0.0.1", port, source_address=(CLIENT, 0), timeout=10) as client:
        assert client.sock is not None
        worker = _worker_of(pids, port, client.sock)
        client.starttls(context=context)
        client.ehlo()
        token = base64.b64encode(f"\0alice\0{password}".encode()).decode()
        return client.docmd("AUTH", f"PLAIN {token}"), worker


def test_auth_failures_spread_over_both_workers_lock_the_address_out_at_the_nodes_limit(tmp_path: Path) -> None:
    users = tmp_path / "users"
    set_password(users, "alice", PASSWORD)
    smtp = {"auth_users": str(users), "auth_failures_per_address": 3, "auth_failures_per_user": 100}
    with _node(tmp_path / "node", **smtp) as pigeon:
        pids = pigeon.shard_owners()
        guesses = [_auth(pigeon.smtp_port, pids, f"guess-{i}") for i in range(3)]
        assert [reply for reply, _ in guesses] == [WRONG] * 3

        # From now on every connection is refused unchecked, on either worker, right password too.
        after = [_auth(pigeon.smtp_port, pids, PASSWORD if i % 2 else f"guess-{i + 3}") for i in range(12)]
        assert [reply for reply, _ in after] == [LOCKED_OUT] * 12
        assert {worker for _, worker in guesses + after} == {0, 1}
        assert pigeon.stderr().count("AUTH locked out for client 127.0.0.7") == 1
