"""The configuration a supervisor hands each worker it starts: texts, on the worker's stdin.

A worker the supervisor starts again (it crashed, was killed, or hung past `[node]
worker_timeout`) must run the configuration the node runs, not the file as it is on disk by
then: the keys a reload leaves for the next restart (listen addresses, relay networks, paths,
tokens...) as they were when the node started, and the reloadable ones as of the last reload
that loaded. So the supervisor keeps the file's text as it read it at the start (`start`) and
as it read it at the last SIGHUP whose text loaded (`reloaded`), and writes both to every
worker it starts, which starts on `start` and takes `reloaded` at once through its reload
(`pigeon.node.node.Node.reload`), as a SIGHUP would have. Texts, not a file: the config may
hold secrets, and the workers may run as another user (`[node] user`).
"""

from __future__ import annotations

from typing import BinaryIO

import msgspec


class HandedConfig(msgspec.Struct, frozen=True):
    """The config file's texts a worker runs on (see the module)."""

    start: str
    reloaded: str | None = None


def encode(handed: HandedConfig) -> bytes:
    """The document a supervisor writes to a worker's stdin."""
    return msgspec.json.encode(handed)


def read(stream: BinaryIO) -> HandedConfig:
    """The document on `stream` (a worker's stdin), read to its end. Raises ValueError if it
    is not one (`msgspec.DecodeError` is a ValueError)."""
    return msgspec.json.decode(stream.read(), type=HandedConfig)
