"""A worker's last good configuration: what its last successful load read, for its restart.

After a refused reload the files on disk may not load (a DKIM key file overwritten, a policy
module with a syntax error), while the node runs on with what it read before. A worker that
dies and is started again within the running node would read the broken files and fail again
and again; instead it starts with what it was running (`restore`), says so loudly, and its
/healthz says `degraded` until a reload reads the files on disk again.

What is kept, per worker, in one file under the spool's private `run/` directory (0600,
fsynced, replaced atomically at each successful start or reload): the config file's text,
the `[[dkim]]` key files' bytes, and a policy module given as a file path, its source. A
policy given as a dotted module name is not kept (it may be a package, or import others):
a restart imports it from disk. The TLS certificate and key and the users file are not kept
either. Only a worker restarted by its supervisor uses it (`--restarted`): a node started
anew reads the files on disk, and refuses to start if they do not load (the supervisor
removes the workers' files at its start).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import msgspec

from pigeon.config.load import load_text
from pigeon.config.schema import Config
from pigeon.fsync import fsync_directory


class LastGood(msgspec.Struct, frozen=True):
    config_text: str
    files: dict[str, bytes]
    """The DKIM key files' bytes, and a policy module file's source, by the path configured."""


def snapshot_path(spool: Path, worker: int) -> Path:
    return spool / "run" / f"worker-{worker}.last-good"


def forget_all(run_dir: Path) -> None:
    """A node's start: no worker's last good configuration is of this run."""
    for path in run_dir.glob("worker-*.last-good"):
        path.unlink(missing_ok=True)


def kept_files(config: Config) -> list[Path]:
    """The files besides the config file that a load reads and a snapshot keeps."""
    files = [dkim.private_key for dkim in config.dkim]
    module = config.policy.module
    if module is not None and (module.endswith(".py") or "/" in module):
        files.append(Path(module))
    return list(dict.fromkeys(files))


def capture(config_path: Path, config: Config) -> LastGood | None:
    """What the files hold now (None if one cannot be read): taken before a load and again
    after it, a snapshot is kept only if the two agree (`pigeon.node.node._unchanged`)."""
    try:
        return LastGood(
            config_path.read_text(encoding="utf-8"), {str(path): path.read_bytes() for path in kept_files(config)}
        )
    except (OSError, UnicodeDecodeError):
        return None


def save(path: Path, snapshot: LastGood) -> None:
    """Replace the file atomically, private to this user and fsynced."""
    temporary = path.with_name(path.name + ".new")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(msgspec.msgpack.encode(snapshot))
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


def restore(path: Path, config_path: Path) -> Config | None:
    """The configuration kept in `path` (None: none kept, or unreadable), its key files and
    policy module written to a private directory beside it and named in the config instead."""
    try:
        snapshot = msgspec.msgpack.decode(path.read_bytes(), type=LastGood)
    except (OSError, msgspec.DecodeError):
        return None
    directory = path.with_name(path.name + ".d")
    directory.mkdir(mode=0o700, exist_ok=True)
    copies: dict[str, Path] = {}
    for number, (original, data) in enumerate(snapshot.files.items()):
        copy = directory / f"{number}{Path(original).suffix}"
        with contextlib.suppress(FileNotFoundError):
            copy.unlink()
        descriptor = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        copies[original] = copy
    return load_text(snapshot.config_text, config_path, redirect=copies)
