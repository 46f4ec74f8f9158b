"""The DKIM key operation in a process of its own, next to the worker.

Why not a thread: `cryptography` lets go of the GIL while OpenSSL signs, but takes it back
after every signature, and a worker's event loop keeps the GIL busy. Each hand-back then waits
for the loop to let go (up to the interpreter's switch interval), and the two threads' tug of
war cost a relay, measured, twice the CPU of the signatures themselves (0.68 CPU ms a message
for 0.25 ms of RSA-2048). A process has a GIL of its own: the worker sends what to sign and
goes on; the signatures come back on a pipe the loop reads like a socket.

Each message's request is written at once, not gathered for the end of the loop's turn: the
message's 250 waits for its signatures, and half a turn of a busy loop is a millisecond.
Measured (`bench/dkim.py`, RSA-2048, 5 KiB, 5 rounds), sending at once and handing answers
straight to callbacks (no reader task, no futures) took signing on/off from 0.71-0.74 to 0.78. Signing a burst of
requests side by side (threads in the child, or two children) was measured too, and lost:
the two cores are busy, and the hand-offs cost more than the waiting they saved.

The child also does everything else a signature needs: it parses the header, canonicalizes
and hashes the body, and builds each DKIM-Signature field. The worker only chooses the signers
(it must know at once whether any applies) and sends the message: copying it into the pipe
costs a microsecond or two, where hashing it on the loop cost 36 µs at 5 KiB and 210 µs at
50 KiB, time every other client of the worker waited through.

Protocol (frames on the child's stdin and stdout: a 4-byte big-endian length, then msgpack):

* the first frame holds the keys, PEM (PKCS#8), and the signers (`_spec`: each names its key
  by its place in that list); the child answers it with the number of keys it loaded, once
  it has (it is ready);
* then each request is a list of `[signer indices, message, timestamp]`, answered, in order,
  by a list of each message's DKIM-Signature fields (bytes: the fields, CRLF-terminated, to
  put on top of it), or of error texts (str) for the messages that could not be signed.

The child ends when its stdin closes (the worker closed it, or died: nothing outlives a
worker), quietly too when it finds its stdout closed or a frame cut short (the worker died).
It ignores SIGINT, which a terminal sends to the whole process group; the worker stops it. It
holds no listening socket of the worker's: those are not inheritable (`pigeon.node.sockets`),
since uvloop, which spawns it, does not do `close_fds`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import struct
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO, Final, cast

import msgspec
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from pigeon.dkim.canonical import header_fields, split_message
from pigeon.dkim.keys import PrivateKey, public_value
from pigeon.dkim.signer import Signer, Signers

_log = logging.getLogger(__name__)
_LENGTH: Final = struct.Struct(">I")
_ENCODE = msgspec.msgpack.Encoder()
_DECODE = msgspec.msgpack.Decoder()


ANSWER_TIMEOUT = 10.0
"""Seconds a request may wait for its answer (a signature takes well under a millisecond):
past that the child is taken for stuck, killed, and what it was asked fails (451). Counted
from when the child is ready, or from the request if it came later."""

START_TIMEOUT = 30.0
"""Seconds the child may take to be ready (an interpreter and `cryptography` to import and the
keys to load, on a machine that may be busy), after which it is taken for stuck as above."""


class KeyProcessFailed(RuntimeError):
    """The signing process went away (or could not start) before answering."""


Reply = Callable[[list[bytes | str] | BaseException], None]
"""Called with a request's answers, or with why it cannot be answered (`KeyProcessFailed`)."""


class KeyProcess:
    """One signing process for a set of signers, started with `start()`.

    Answers are handed to plain callbacks as the pipe's data is delivered: a message's 250
    waits on its signature, and every hop through a future or a reader task would add a turn
    of a busy loop (a millisecond or more) to each message's latency.
    """

    def __init__(self, signers: Sequence[Signer]) -> None:
        self.signers = list(signers)
        self.keys: list[PrivateKey] = list({id(s.key): s.key for s in self.signers}.values())
        self.answer_timeout = ANSWER_TIMEOUT
        self.start_timeout = START_TIMEOUT
        self._index = {id(signer): n for n, signer in enumerate(self.signers)}
        self._transport: asyncio.SubprocessTransport | None = None
        self._stdin: asyncio.WriteTransport | None = None
        self._received = bytearray()
        self._batch: list[list[Any]] = []
        self._batch_replies: list[tuple[Reply, int]] = []
        self._sent: deque[tuple[Reply, int, float]] = deque()  # (reply, items, when sent)
        self._watchdog: asyncio.TimerHandle | None = None
        self._exited: asyncio.Future[None] | None = None
        self._failed: BaseException | None = None
        self._started = False  # requests made before are sent once it is
        self._ready = False  # it said it loaded the keys: answers come within answer_timeout
        self._closing = False

    def index(self, signer: Signer) -> int:
        """Where `signer` is in the list the child was given, as requests name it."""
        return self._index[id(signer)]

    def serves(self, signers: Sequence[Signer]) -> bool:
        """Whether this process signs as `signers` would, one by one: the same blocks in the
        same order (all the child knows of each) with keys of the same value. A reload that
        changed nothing of DKIM (a SIGHUP for a route, a user) keeps it: a new one takes a
        fifth of a second to a second to start (an interpreter, `cryptography`, the keys
        checked), and every message to sign waits for it."""
        return len(signers) == len(self.signers) and all(
            _view(new) == _view(old) for new, old in zip(signers, self.signers, strict=True)
        )

    def rebind(self, signers: Sequence[Signer]) -> None:
        """Requests name `signers` from now on, each as the one at its place (`serves` them)."""
        self._index = {id(signer): n for n, signer in enumerate(signers)}

    @property
    def alive(self) -> bool:
        return self._failed is None

    @property
    def exited(self) -> bool:
        """Whether the child has exited (and been reaped)."""
        return self._exited is not None and self._exited.done()

    @property
    def pid(self) -> int | None:
        """The child's process id, once started."""
        return None if self._transport is None else self._transport.get_pid()

    async def start(self) -> None:
        """Start the child, hand it the keys, then what was asked meanwhile. If it cannot start,
        what was asked fails with `KeyProcessFailed`, as will what is asked later."""
        if self._failed is not None:
            return  # closed for good before it started
        loop = asyncio.get_running_loop()
        self._exited = loop.create_future()
        try:
            self._transport, _ = await loop.subprocess_exec(
                lambda: _Pipes(self),
                sys.executable,
                "-P",  # (not the working directory first on the import path: see the supervisor)
                "-m",
                "pigeon.dkim.key_process",
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                # The child's own first and last words (a traceback) go where the worker's go.
                stderr=None,
            )
        except Exception as error:  # (what was asked must fail, not wait for ever)
            self._fail(KeyProcessFailed(f"cannot start the DKIM signing process: {error!r}"))
            return
        # (uvloop's pipe transports do not subclass asyncio's, hence the cast, not a check)
        self._stdin = cast(asyncio.WriteTransport, self._transport.get_pipe_transport(0))
        pems = [
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            for key in self.keys
        ]
        key_index = {id(key): n for n, key in enumerate(self.keys)}
        specs = [_spec(signer, key_index[id(signer.key)]) for signer in self.signers]
        try:
            self._write([pems, specs])
        except (OSError, RuntimeError) as error:  # it died already (uvloop raises, asyncio does not)
            self._fail(KeyProcessFailed(f"the DKIM signing process cannot be written to: {error}"))
            return
        self._started = True
        self._flush()
        if self._closing:  # replaced (a reload) while it started: it answers, then ends
            self._close_stdin()

    def sign(self, items: list[list[Any]], reply: Reply) -> None:
        """Sign `[signer indices, message, timestamp]` items: `reply` gets each message's
        DKIM-Signature fields (or error texts), in order, or why none can come. The request
        goes to the child at once (once it has started: what is asked before goes in one frame
        when it has)."""
        if self._failed is not None:
            _answer(reply, self._failed)
            return
        self._batch += items
        self._batch_replies.append((reply, len(items)))
        if self._started:
            self._flush()

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
        if self._stdin is not None:
            self._stdin.close()

    async def aclose(self) -> None:
        """Stop now: what was asked and not answered fails; the child is waited for (killed after
        a second if it does not end with its stdin)."""
        self.close(wait_for_answers=False)
        self._close_stdin()
        transport, exited = self._transport, self._exited
        if transport is None or exited is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(exited), 1.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                transport.kill()
            await exited
        transport.close()

    def _flush(self) -> None:
        if self._failed is not None or not self._batch or not self._started:
            return
        batch, self._batch = self._batch, []
        now = asyncio.get_running_loop().time()
        self._sent.extend((reply, count, now) for reply, count in self._batch_replies)
        self._batch_replies = []
        try:
            self._write(batch)
        except (OSError, RuntimeError) as error:  # its pipe is closed (it died, or is closing)
            self._fail(KeyProcessFailed(f"the DKIM signing process cannot be written to: {error}"))
            return
        self._watch()

    def _watch(self) -> None:
        """Arm the watchdog for the oldest request waiting: a child that is stopped or stuck
        (not dead: its end would be seen) must not hold messages, whose clients wait for a 250,
        for ever."""
        if self._watchdog is None and self._sent:
            deadline = self._sent[0][2] + self._limit
            self._watchdog = asyncio.get_running_loop().call_at(deadline, self._overdue)

    @property
    def _limit(self) -> float:
        # Starting is not answering: a busy machine may take seconds to start an interpreter,
        # which must not count against a signature's fraction of a millisecond.
        return self.answer_timeout if self._ready else self.start_timeout

    def _overdue(self) -> None:
        self._watchdog = None
        if self._failed is not None or not self._sent:
            return
        limit = self._limit
        waited = asyncio.get_running_loop().time() - self._sent[0][2]
        if waited < limit:
            self._watch()  # the one it was armed for was answered (or it became ready): watch anew
            return
        what = "answer" if self._ready else "start"
        _log.error(
            "the DKIM signing process (pid %s) did not %s within %gs: killed; a new one signs the next message",
            self.pid,
            what,
            limit,
        )
        self._fail(KeyProcessFailed(f"the DKIM signing process did not {what} within {limit:g}s"))
        if self._transport is not None:
            with contextlib.suppress(ProcessLookupError):
                self._transport.kill()

    def _write(self, value: Any) -> None:
        assert self._stdin is not None
        payload = _ENCODE.encode(value)
        self._stdin.write(_LENGTH.pack(len(payload)) + payload)

    def _answers_arrived(self, data: bytes) -> None:
        received = self._received
        received += data
        start = 0
        while len(received) - start >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(received, start)
            end = start + _LENGTH.size + length
            if len(received) < end:
                break
            try:
                answers: list[bytes | str] = _DECODE.decode(received[start + _LENGTH.size : end])
            except msgspec.DecodeError as error:
                self._fail(KeyProcessFailed(f"the DKIM signing process answered nonsense: {error}"))
                return
            start = end
            if not self._ready:  # its first frame: the keys are loaded
                self._became_ready()
                continue
            taken = 0
            while taken < len(answers) and self._sent:
                reply, count, _ = self._sent.popleft()
                _answer(reply, answers[taken : taken + count])
                taken += count
        del received[:start]

    def _became_ready(self) -> None:
        """What waited for the start is timed from now, against `answer_timeout`."""
        self._ready = True
        now = asyncio.get_running_loop().time()
        self._sent = deque((reply, count, now) for reply, count, _ in self._sent)
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._watch()

    def _ended(self) -> None:
        """Its stdout closed or it exited: what it was asked and has not answered fails."""
        code = None if self._transport is None else self._transport.get_returncode()
        detail = "its output closed" if code is None else f"exit status {code}"
        self._fail(KeyProcessFailed(f"the DKIM signing process ended ({detail})"))

    def _fail(self, error: BaseException) -> None:
        if self._failed is None:
            self._failed = error
        if self._watchdog is not None:  # nothing is left to watch
            self._watchdog.cancel()
            self._watchdog = None
        waiting = [entry[0] for entry in self._sent] + [reply for reply, _ in self._batch_replies]
        self._sent.clear()
        self._batch_replies = []
        self._batch = []
        for reply in waiting:
            _answer(reply, error)


def _answer(reply: Reply, answer: list[bytes | str] | BaseException) -> None:
    # A reply that raises is a bug in its message's path; it must not break the pipe every
    # other message's signatures come back on.
    try:
        reply(answer)
    except Exception:
        _log.exception("handing back a DKIM signature failed")


class _Pipes(asyncio.SubprocessProtocol):
    """The child's pipes and exit, as they happen, to its `KeyProcess`."""

    def __init__(self, owner: KeyProcess) -> None:
        self._owner = owner

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self._owner._answers_arrived(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:  # the end of its output: every answer it wrote has been handed back
            self._owner._ended()

    def process_exited(self) -> None:
        # Not a reason to fail anything: the exit and the end of its output are reported
        # separately, and a child that was closed (a reload) answers, then exits, so its last
        # answers may still be on their way. The end of its output fails what is left.
        exited = self._owner._exited
        if exited is not None and not exited.done():
            exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        transport = self._owner._transport
        if transport is not None:  # its pipes are closed and it has exited: nothing more comes
            transport.close()


# --- the child ----------------------------------------------------------------------------------


def _read_frame(stream: BinaryIO) -> Any:
    """The next frame, or None at the end of the input: closed, or cut short (the worker died
    writing it)."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(head)
    payload = stream.read(length)
    if len(payload) < length:
        return None
    return _DECODE.decode(payload)


def _write_frame(stream: BinaryIO, value: Any) -> None:
    payload = _ENCODE.encode(value)
    stream.write(_LENGTH.pack(len(payload)) + payload)
    stream.flush()


def _spec(signer: Signer, key: int) -> list[Any]:
    """What the child needs of `signer` (its key by its place in the keys sent)."""
    return [
        key,
        signer.domain,
        signer.selector,
        signer.algorithm,
        list(signer.headers),
        sorted(signer.over_signed),
        signer.relaxed_header,
        signer.relaxed_body,
        signer.signing_domain,
    ]


def _view(signer: Signer) -> tuple[Any, ...]:
    """What the child knows of `signer` (`_spec`), its key by value."""
    return (*_spec(signer, 0)[1:], public_value(signer.key))


def _signer(spec: list[Any], keys: list[PrivateKey]) -> Signer:
    key, domain, selector, algorithm, headers, over_signed, relaxed_header, relaxed_body, signing_domain = spec
    return Signer(
        domain=domain,
        selector=selector,
        algorithm=algorithm,
        key=keys[key],
        headers=tuple(headers),
        over_signed=frozenset(over_signed),
        relaxed_header=relaxed_header,
        relaxed_body=relaxed_body,
        signing_domain=signing_domain,
    )


def _signatures(signers: Signers, chosen: list[Signer], message: bytes, timestamp: int) -> bytes:
    head, body = split_message(message)
    return b"".join(u.sign() for u in signers.prepare(header_fields(head), body, chosen, timestamp))


def main() -> None:
    """The child: sign what the worker asks until its input ends. A worker that went away (it
    was killed, it died) is no error of the child's: it ends without a word, where a traceback
    of the pipe it can no longer write to (BrokenPipeError) said nothing an operator can use."""
    try:
        _serve()
    except (BrokenPipeError, ConnectionResetError):
        # (Exit now, not through the interpreter's exit: it would flush stdout again, and say
        # that this failed too.)
        os._exit(0)


def _serve() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    first = _read_frame(stdin)
    if first is None:
        return
    pems, specs = first
    keys: list[PrivateKey] = []
    for pem in pems:
        key = serialization.load_pem_private_key(pem, password=None)
        assert isinstance(key, rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey)
        keys.append(key)
    signers = Signers([_signer(spec, keys) for spec in specs])
    _write_frame(stdout, len(keys))  # ready
    while (batch := _read_frame(stdin)) is not None:
        answers: list[bytes | str] = []
        for indices, message, timestamp in batch:
            try:
                answers.append(_signatures(signers, [signers.all[i] for i in indices], message, timestamp))
            except Exception as error:  # that message fails, the others are signed
                answers.append(f"{type(error).__name__}: {error}")
        _write_frame(stdout, answers)


if __name__ == "__main__":
    main()
