"""Signing a received message: the event loop prepares, a thread does the key operation.

An RSA-2048 signature costs about a millisecond of CPU, twice what Pigeon spends relaying a
whole message. `cryptography` releases the GIL while OpenSSL signs (measured: two threads
signing keep two cores busy), so the key operation runs in a thread of its own and the
event loop goes on meanwhile. Everything before it (choosing the signers, parsing the
header, hashing the body) holds the GIL anywhere, and costs tens of microseconds: it runs on
the loop, where a thread hop would cost more than it saves. A body that was spilled to a file
(over `[spool] inline_limit`) is read back and hashed in the thread.

The thread takes every job waiting when it wakes and hands results back as each is done,
waking the loop once for as many as are ready (`_Worker`): measured on uvloop, that costs the
loop about 5 µs of CPU a message, where `loop.run_in_executor` cost 30 to 40 µs (its
concurrent future, its wrapper and a wake-up for each).

`Signing.keys` is replaced whole on SIGHUP (`reload`): a message being signed keeps the
signers it started with.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pigeon.config.schema import DkimConfig
from pigeon.dkim.canonical import Field, header_fields, split_message
from pigeon.dkim.keys import KeyProblem, PrivateKey, load_key
from pigeon.dkim.signer import Signer, Signers, Unsigned

_log = logging.getLogger(__name__)


def load_signers(configs: Sequence[DkimConfig]) -> Signers:
    """Every `[[dkim]]` block with its key read (each file once). Raises `KeyProblem`, naming
    the block and the file, if a key cannot be used."""
    keys: dict[tuple[Path, str], PrivateKey] = {}
    signers = []
    for number, config in enumerate(configs, start=1):
        cached = (config.private_key, config.algorithm)
        if cached not in keys:
            try:
                keys[cached] = load_key(config.private_key, config.algorithm)
            except KeyProblem as error:
                which = f"[[dkim]] #{number} ({config.name or config.domain}, selector {config.selector})"
                raise KeyProblem(f"{which} private_key: {error}") from None
        signers.append(Signer.from_config(config, keys[cached]))
    return Signers(signers)


class Signing:
    """The signers in force and the thread that signs for them."""

    def __init__(self, signers: Signers) -> None:
        self.keys = signers
        self._worker: _Worker | None = None  # started at the first signature

    def sign(
        self, message: bytes | Path, head: bytes, tenant: str | None, timestamp: int, names: Sequence[str] | None = None
    ) -> asyncio.Future[bytes] | None:
        """The DKIM-Signature fields to put on top of `message` (its bytes, or the file that
        holds them), or None when no signer applies (found before anything else is done).
        `head`: the header section, to choose by when the message is in a file. The future
        fails with the key operation's error."""
        keys = self.keys
        if not keys.all:
            return None
        if isinstance(message, Path):
            signers = keys.choose(header_fields(head), tenant, names)
            if not signers:
                return None
            return self._submit(_sign_file, message, keys, signers, timestamp)
        head, body = split_message(message)
        fields = header_fields(head)
        signers = keys.choose(fields, tenant, names)
        if not signers:
            return None
        return self._submit(_sign_all, keys.prepare(fields, body, signers, timestamp))

    def _submit(self, job: Callable[..., bytes], *args: Any) -> asyncio.Future[bytes]:
        if self._worker is None:
            self._worker = _Worker(asyncio.get_running_loop())
        return self._worker.submit(job, args)

    def reload(self, configs: Sequence[DkimConfig]) -> Signers:
        """Read the keys again (SIGHUP). Raises `KeyProblem` and keeps the old ones if any
        cannot be used."""
        signers = load_signers(configs)
        self.keys = signers
        return signers

    def close(self) -> None:
        """Stop the thread once the jobs it has are done (their results are not delivered)."""
        if self._worker is not None:
            self._worker.close()


_Job = tuple[Callable[..., bytes], tuple[Any, ...], "asyncio.Future[bytes]"]
_Done = tuple["asyncio.Future[bytes]", bytes | None, BaseException | None]


class _Worker:
    """One thread running jobs for one event loop, in the order given."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._cond = threading.Condition()
        self._jobs: list[_Job] = []
        self._done: list[_Done] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="dkim-sign", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[..., bytes], args: tuple[Any, ...]) -> asyncio.Future[bytes]:
        future: asyncio.Future[bytes] = self._loop.create_future()
        with self._cond:
            self._jobs.append((job, args, future))
            if len(self._jobs) == 1:
                self._cond.notify()
        return future

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._jobs and not self._closed:
                    cond.wait()
                if not self._jobs:
                    return
                jobs, self._jobs = self._jobs, []
            for job, args, future in jobs:
                try:
                    done: _Done = (future, job(*args), None)
                except Exception as error:  # handed to the waiting message, which is refused
                    done = (future, None, error)
                with cond:
                    self._done.append(done)
                    wake = len(self._done) == 1  # else the loop is already told
                if wake:
                    try:
                        self._loop.call_soon_threadsafe(self._deliver)
                    except RuntimeError:  # the loop is closed: no one is waiting any more
                        return

    def _deliver(self) -> None:
        with self._cond:
            done, self._done = self._done, []
        for future, value, error in done:
            if future.cancelled():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                assert value is not None
                future.set_result(value)


def _sign_all(unsigned: list[Unsigned]) -> bytes:
    return b"".join(u.sign() for u in unsigned)


def _sign_file(path: Path, keys: Signers, signers: list[Signer], timestamp: int) -> bytes:
    head, body = split_message(path.read_bytes())
    fields: list[Field] = header_fields(head)
    return _sign_all(keys.prepare(fields, body, signers, timestamp))
