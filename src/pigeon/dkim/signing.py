"""Signing a received message: the event loop chooses the signers, a process of its own signs.

An RSA-2048 signature costs a quarter to a whole millisecond of CPU, as much as Pigeon spends
relaying a whole message, so it runs off the event loop, in the worker's signing process
(`pigeon.dkim.key_process`: a thread would fight the loop for the GIL after every signature),
with the hashing of the message before it (tens of microseconds at 5 KiB, hundreds at 50).
The loop only parses the header to choose the signers, which it must know at once (none may
apply, or a policy may have named one that cannot sign), and sends the message.

A body that was spilled to a file (over `[spool] inline_limit`: rare, and big) is read back,
hashed and signed in a thread (`_Worker`), which takes every job waiting when it wakes and
wakes the loop once for as many results as are ready.

`Signing.keys` is replaced whole on SIGHUP (`reload`): a message being signed keeps the
signers it started with. The signing process is replaced only if the new signers sign
otherwise (`KeyProcess.serves`): a new one takes a fifth of a second to a second to be ready,
and every message to sign waits for it.
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
from pigeon.dkim.key_process import KeyProcess, KeyProcessFailed
from pigeon.dkim.keys import KeyProblem, PrivateKey, load_key
from pigeon.dkim.signer import Signer, SignerRefused, Signers, Unsigned

_log = logging.getLogger(__name__)

Signed = Callable[[bytes | BaseException], None]
"""Given a message's DKIM-Signature fields, or why it could not be signed."""


def shared_key_warnings(configs: Sequence[DkimConfig]) -> list[str]:
    """What to warn about at start and at each reload: a block whose domain glob matches more
    than one domain and that has no `signing_domain` signs each author domain it matches as
    d=<that domain> with its one key, which verifies only where the selector is published
    under every such domain (`domain = "*"` signs anyone's mail with the key of one)."""
    warnings = []
    for number, config in enumerate(configs, start=1):
        if config.signing_domain is None and matches_several(config.domain):
            which = f"[[dkim]] #{number} ({config.name or config.domain}, selector {config.selector})"
            warnings.append(
                f"{which}: domain {config.domain!r} matches more than one domain and there is no signing_domain: "
                f"each author domain it matches is signed as d=<that domain> with this one key, so "
                f"{config.selector}._domainkey.<domain> must be published under every such domain "
                "(else its signatures fail); or set signing_domain"
            )
    return warnings


def matches_several(glob: str) -> bool:
    """Whether a domain glob can match more than one domain: it has a `*` or a `?`, or a set
    (`[...]`) of more than one character, a range or a negation. `example.co[m]` names
    example.com alone; a `[` that no `]` closes is itself, as fnmatch reads it."""
    at = 0
    while at < len(glob):
        char = glob[at]
        at += 1
        if char in "*?":
            return True
        if char != "[":
            continue
        # fnmatch's set: a "!" first negates, and a "]" first (after it) is a member.
        start = at + (glob[at : at + 1] == "!")
        end = glob.find("]", start + (glob[start : start + 1] == "]"))
        if end < 0:
            continue  # not a set: "[" stands for itself
        members, at = glob[at:end], end + 1
        if members.startswith("!"):
            return True  # every character but some
        found: set[str] = set()
        index = 0
        while index < len(members):
            if members[index + 1 : index + 2] == "-" and index + 2 < len(members):
                low, high = members[index], members[index + 2]
                if low < high:
                    return True
                if low == high:
                    found.add(low)
                index += 3  # (a range backwards matches nothing)
            else:
                found.add(members[index])
                index += 1
        if len(found) > 1:
            return True
    return False


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
    """The signers in force, and the process (and thread) that sign for them."""

    Refused = SignerRefused
    """What `sign` raises when a signer a policy named cannot sign the message: caught through
    here by the intake, which does not import DKIM's modules (a node without [[dkim]] never
    loads them)."""

    def __init__(self, signers: Signers) -> None:
        self.keys = signers
        self._worker: _Worker | None = None  # started at the first spilled body
        self._process: KeyProcess | None = None  # started at the first signature, for `_process_keys`
        self._process_keys: Signers | None = None
        self._retired: set[KeyProcess] = set()  # replaced (a reload, a death) and maybe not ended yet

    def sign(
        self,
        message: bytes | Path,
        head: bytes,
        tenant: str | None,
        timestamp: int,
        names: Sequence[str] | None = None,
        *,
        then: Signed,
    ) -> bool:
        """Sign `message` (its bytes, or the file that holds them): `then` gets the
        DKIM-Signature fields to put on top of it, or the key operation's error. False (and
        `then` is never called) when no signer applies, found before anything else is done.
        `head`: the header section, to choose by when the message is in a file.

        `then` is called as soon as the signatures are read (not a turn of the loop later, as a
        future's callbacks are): the message's 250 waits on it."""
        keys = self.keys
        if not keys.all:
            return False
        if isinstance(message, Path):
            signers = keys.choose(header_fields(head), tenant, names)
            if not signers:
                return False
            job = self._submit(_sign_file, message, keys, signers, timestamp)
            job.add_done_callback(lambda done: then(done.exception() or done.result()))
            return True
        signers = keys.choose(header_fields(split_message(message)[0]), tenant, names)
        if not signers:
            return False
        process = self._key_process(keys)
        process.sign([[[process.index(s) for s in signers], message, timestamp]], lambda answer: _fields(answer, then))
        return True

    async def sign_bytes(
        self, message: bytes, tenant: str | None, timestamp: int, names: Sequence[str] | None = None
    ) -> bytes | None:
        """`sign`, awaited: the DKIM-Signature fields for `message`, or None when no signer
        applies. Raises `Refused` or the key operation's error. For a message signed again on
        its way out (its 7-bit form, `pigeon.delivery.seven_bit`): rare, and not in a hurry."""
        done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        def then(signed: bytes | BaseException) -> None:
            if done.done():
                return
            if isinstance(signed, BaseException):
                done.set_exception(signed)
            else:
                done.set_result(signed)

        if not self.sign(message, b"", tenant, timestamp, names, then=then):
            return None
        return await done

    def _key_process(self, keys: Signers) -> KeyProcess:
        """The signing process for `keys`: a new one after a reload that changed them, or
        after one died."""
        process = self._process
        if process is not None and self._process_keys is keys and process.alive:
            return process
        if process is not None and process.alive and process.serves(keys.all):
            process.rebind(keys.all)  # (a reload that changed no signer, nor any key)
            self._process_keys = keys
            return process
        if process is not None:
            process.close()  # it answers what it has, then ends
            # (kept until it has, so that closing the signing stops it too)
            self._retired = {p for p in self._retired if not p.exited} | {process}
        self._process, self._process_keys = KeyProcess(keys.all), keys
        task = asyncio.get_running_loop().create_task(self._process.start(), name="dkim key process start")
        _starting.add(task)
        task.add_done_callback(_starting.discard)
        return self._process

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

    async def close(self) -> None:
        """Stop the processes and the thread (results still to come are not delivered)."""
        processes = self._retired | ({self._process} if self._process is not None else set())
        await asyncio.gather(*(process.aclose() for process in processes))
        if self._worker is not None:
            self._worker.close()


_starting: set[asyncio.Task[None]] = set()  # asyncio keeps only weak references to tasks


def _fields(answer: list[bytes | str] | BaseException, then: Signed) -> None:
    """The process's answer for one message, to `then`."""
    if isinstance(answer, BaseException):
        then(answer)
        return
    (fields,) = answer
    then(KeyProcessFailed(f"signing failed: {fields}") if isinstance(fields, str) else fields)


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
