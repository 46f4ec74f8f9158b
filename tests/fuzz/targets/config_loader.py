"""The config loader: any file gives a `Config` or a `ConfigError` naming what is wrong, never
a traceback."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Final

from pigeon.config.load import ConfigError, load

_DIRECTORY: Final = Path(tempfile.mkdtemp(prefix="pigeon-fuzz-config-"))
_FILE: Final = _DIRECTORY / "pigeon.toml"
atexit.register(shutil.rmtree, _DIRECTORY, True)


def check(data: bytes) -> None:
    _FILE.write_bytes(data)
    try:
        load(_FILE)
    except ConfigError as error:
        if not str(error):
            raise AssertionError("a configuration error without a message") from error
