"""The DKIM key operation in a process of its own, next to the worker.

Why not a thread: `cryptography` lets go of the GIL while OpenSSL signs, but takes it back
after every signature, and a worker's event loop keeps the GIL busy. Each hand-back then waits
for the loop to let go (up to the interpreter's switch interval), and the two threads' tug of
war cost a relay, measured, twice the CPU of the signatures themselves (0.68 CPU ms a message
for 0.25 ms of RSA-2048). A process has a GIL of its own: the worker sends what to sign, a
batch at a time, and goes on; the signatures come back on a pipe the loop reads like a socket.

Protocol (frames on the child's stdin and stdout: a 4-byte big-endian length, then msgpack):

* the first frame holds the keys, PEM (PKCS#8), in the order requests name them;
* then each request is a list of `[key index, digest]` (the SHA-256 hash the signature
  signs: RFC 6376 3.7 for RSA, RFC 8463 3 for Ed25519), answered, in order, by a list of
  signatures (bytes), or of error texts (str) for the items that could not be signed.

The child ends when its stdin closes (the worker closed it, or died: nothing outlives a
worker). It ignores SIGINT, which a terminal sends to the whole process group; the worker
stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import struct
import sys
from collections import deque
from collections.abc import Sequence
from typing import Any, BinaryIO, Final

import msgspec
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed

from pigeon.dkim.keys import PrivateKey

_LENGTH: Final = struct.Struct(">I")
_ENCODE = msgspec.msgpack.Encoder()
_DECODE = msgspec.msgpack.Decoder()


class KeyProcessFailed(RuntimeError):
    """The signing process went away (or could not start) before answering."""


class KeyProcess:
    """One signing process for a set of keys, started with `start()`."""

    def __init__(self, keys: Sequence[PrivateKey]) -> None:
        self.keys = list(keys)
        self._index = {id(key): n for n, key in enumerate(self.keys)}
        self._process: asyncio.subprocess.Process | None = None
        self._batch: list[list[Any]] = []
        self._batch_futures: list[tuple[asyncio.Future[list[bytes | str]], int]] = []
        self._sent: deque[tuple[asyncio.Future[list[bytes | str]], int]] = deque()
        self._reader: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        self._started = False  # requests made before are sent once it is
        self._closing = False

    def index(self, key: PrivateKey) -> int:
        return self._index[id(key)]

    @property
    def alive(self) -> bool:
        return self._failed is None

    async def start(self) -> None:
        """Start the child, hand it the keys, then what was asked meanwhile. If it cannot start,
        what was asked fails with `KeyProcessFailed`, as will what is asked later."""
        if self._failed is not None:
            return  # closed for good before it started
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-P",  # (not the working directory first on the import path: see the supervisor)
                "-m",
                "pigeon.dkim.key_process",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                # The child's own first and last words (a traceback) go where the worker's go.
                stderr=None,
            )
        except OSError as error:
            self._fail(KeyProcessFailed(f"cannot start the DKIM signing process: {error}"))
            return
        pems = [
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            for key in self.keys
        ]
        self._write(pems)
        self._reader = asyncio.create_task(self._read(), name="dkim key process")
        self._started = True
        self._flush()
        if self._closing:  # replaced (a reload) while it started: it answers, then ends
            self._close_stdin()

    def sign(self, items: list[list[Any]]) -> asyncio.Future[list[bytes | str]]:
        """Signatures (or error texts) for `[key index, digest]` items, in order. Items asked
        for in one turn of the loop go to the child in one frame."""
        future: asyncio.Future[list[bytes | str]] = asyncio.get_running_loop().create_future()
        if self._failed is not None:
            future.set_exception(self._failed)
            return future
        if self._started and not self._batch:
            asyncio.get_running_loop().call_soon(self._flush)
        self._batch += items
        self._batch_futures.append((future, len(items)))
        return future

    def close(self, *, wait_for_answers: bool = True) -> None:
        """No more requests: the child answers what it was asked (if `wait_for_answers`, else
        those requests fail now), then ends, its stdin closed (once it has started, if it has not)."""
        self._closing = True
        if not wait_for_answers:
            self._fail(KeyProcessFailed("the DKIM signing process was closed"))
        if self._started:
            self._flush()
            self._close_stdin()

    def _close_stdin(self) -> None:
        process = self._process
        if process is not None and process.stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                process.stdin.close()

    async def aclose(self) -> None:
        """Stop now: what was asked and not answered fails; the child is waited for (killed after
        a second if it does not end with its stdin)."""
        self.close(wait_for_answers=False)
        self._close_stdin()
        process = self._process
        if process is None:
            return
        try:
            await asyncio.wait_for(process.wait(), 1.0)
        except TimeoutError:
            process.kill()
            await process.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    def _flush(self) -> None:
        if self._failed is not None or not self._batch or not self._started:
            return
        batch, self._batch = self._batch, []
        self._sent.extend(self._batch_futures)
        self._batch_futures = []
        try:
            self._write(batch)
        except (OSError, RuntimeError) as error:
            self._fail(KeyProcessFailed(f"the DKIM signing process cannot be written to: {error}"))

    def _write(self, value: Any) -> None:
        assert self._process is not None and self._process.stdin is not None
        payload = _ENCODE.encode(value)
        self._process.stdin.write(_LENGTH.pack(len(payload)) + payload)

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        stdout = self._process.stdout
        try:
            while True:
                (length,) = _LENGTH.unpack(await stdout.readexactly(_LENGTH.size))
                answers: list[bytes | str] = _DECODE.decode(await stdout.readexactly(length))
                start = 0
                while start < len(answers):
                    future, count = self._sent.popleft()
                    if not future.done():
                        future.set_result(answers[start : start + count])
                    start += count
        except (asyncio.IncompleteReadError, OSError, IndexError, msgspec.DecodeError) as error:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._process.wait(), 1.0)
            code = self._process.returncode
            detail = f"exit status {code}" if code is not None else repr(error)
            self._fail(KeyProcessFailed(f"the DKIM signing process ended ({detail})"))
            transport = getattr(self._process, "_transport", None)
            if transport is not None:  # its pipes, now that nothing more comes
                transport.close()

    def _fail(self, error: BaseException) -> None:
        if self._failed is None:
            self._failed = error
        for future, _ in [*self._sent, *self._batch_futures]:
            if not future.done():
                future.set_exception(error)
        self._sent.clear()
        self._batch_futures = []
        self._batch = []


# --- the child ----------------------------------------------------------------------------------
_PKCS1: Final = padding.PKCS1v15()
_PREHASHED: Final = Prehashed(hashes.SHA256())


def _read_frame(stream: BinaryIO) -> Any:
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(head)
    return _DECODE.decode(stream.read(length))


def _sign_one(key: PrivateKey, digest: bytes) -> bytes:
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(digest)
    return key.sign(digest, _PKCS1, _PREHASHED)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    pems = _read_frame(stdin)
    if pems is None:
        return
    keys: list[PrivateKey] = []
    for pem in pems:
        key = serialization.load_pem_private_key(pem, password=None)
        assert isinstance(key, rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey)
        keys.append(key)
    while (batch := _read_frame(stdin)) is not None:
        answers: list[bytes | str] = []
        for index, digest in batch:
            try:
                answers.append(_sign_one(keys[index], digest))
            except Exception as error:  # that item fails, the others are signed
                answers.append(f"{type(error).__name__}: {error}")
        payload = _ENCODE.encode(answers)
        stdout.write(_LENGTH.pack(len(payload)) + payload)
        stdout.flush()


if __name__ == "__main__":
    main()
