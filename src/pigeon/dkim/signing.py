"""Signing a received message: the event loop prepares, a thread does the key operation.

An RSA-2048 signature costs about a millisecond of CPU, twice what Pigeon spends relaying a
whole message. `cryptography` releases the GIL while OpenSSL signs (measured: two threads
signing keep two cores busy), so the key operation runs in a thread of its own and the
event loop goes on meanwhile. Everything before it (choosing the signers, parsing the
header, hashing the body) holds the GIL anywhere, and costs tens of microseconds: it runs on
the loop, where a thread hop would cost more than it saves. A body that was spilled to a file
(over `[spool] inline_limit`) is read back and hashed in the thread.

`Signing.keys` is replaced whole on SIGHUP (`reload`): a message being signed keeps the
signers it started with.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Sequence
from pathlib import Path

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
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dkim-sign")

    def choose(self, head: bytes, tenant: str | None, names: Sequence[str] | None = None) -> list[Signer]:
        """The signers for a message whose header section starts `head`. Cheap: the common
        "nothing to sign" answer is found before anything else is done."""
        keys = self.keys
        if not keys.all:
            return []
        return keys.choose(header_fields(head), tenant, names)

    def sign(self, message: bytes | Path, signers: list[Signer], timestamp: int) -> asyncio.Future[bytes]:
        """The DKIM-Signature fields to put on top of `message` (its bytes, or the file that
        holds them), in the order of `signers`. Fails with the key operation's error."""
        loop = asyncio.get_running_loop()
        if isinstance(message, Path):
            return loop.run_in_executor(self._thread, _sign_file, message, self.keys, signers, timestamp)
        head, body = split_message(message)
        unsigned = self.keys.prepare(header_fields(head), body, signers, timestamp)
        return loop.run_in_executor(self._thread, _sign_all, unsigned)

    def reload(self, configs: Sequence[DkimConfig]) -> Signers:
        """Read the keys again (SIGHUP). Raises `KeyProblem` and keeps the old ones if any
        cannot be used."""
        signers = load_signers(configs)
        self.keys = signers
        return signers

    def close(self) -> None:
        self._thread.shutdown(wait=True)


def _sign_all(unsigned: list[Unsigned]) -> bytes:
    return b"".join(u.sign() for u in unsigned)


def _sign_file(path: Path, keys: Signers, signers: list[Signer], timestamp: int) -> bytes:
    head, body = split_message(path.read_bytes())
    fields: list[Field] = header_fields(head)
    return _sign_all(keys.prepare(fields, body, signers, timestamp))
