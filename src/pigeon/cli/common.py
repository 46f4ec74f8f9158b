"""What several commands share: the -c option and loading the configuration."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pigeon.config.load import ConfigError, load
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


def load_config(args: argparse.Namespace) -> Config:
    """The configuration, or exit 2 with the loader's message."""
    try:
        return load(args.config)
    except ConfigError as error:
        print(f"pigeon: configuration error: {redact(str(error))}", file=sys.stderr)
        raise SystemExit(2) from None
