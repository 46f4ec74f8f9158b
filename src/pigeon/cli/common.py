"""What several commands share: the -c option and loading the configuration."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pigeon.config.load import ConfigError, load, load_keys
from pigeon.config.schema import Config
from pigeon.redaction import redact


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c",
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML configuration file (default: none, the built-in defaults)",
    )


def os_reason(error: OSError) -> str:
    """An OSError as a command says it after what it could not do: "No such file or directory",
    not Python's "[Errno 2] No such file or directory: 'x.eml'" (the command names the file)."""
    return error.strerror or str(error) or type(error).__name__


def load_config(args: argparse.Namespace, *, enough: Sequence[tuple[str, str]] = ()) -> Config:
    """The configuration, or exit 2 with the loader's message. `enough`: the keys this
    command needs (`("log", "path")`, ...): if the file does not load as a whole but they do,
    the command goes on with them, after a warning, as the running node does on the last
    configuration that loaded (`load_keys`)."""
    try:
        return load(args.config)
    except ConfigError as error:
        reason = redact(str(error))
        partial = load_keys(args.config, enough) if enough and args.config is not None else None
        if partial is None:
            print(f"pigeon: configuration error: {reason}", file=sys.stderr)
            raise SystemExit(2) from None
        names = ", ".join(f"[{section}] {key}" for section, key in enough)
        print(f"pigeon: warning: configuration error: {reason}; going on with {names} from it", file=sys.stderr)
        return partial
