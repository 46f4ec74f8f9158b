"""`pigeon logs`: print the event log as JSON lines, from every segment, compressed or not."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import msgspec

from pigeon.cli.common import add_config_option, load_config
from pigeon.logs.reader import follow, merged_lines
from pigeon.logs.records import RECORD_TYPES

EXAMPLES = """examples:
  pigeon logs                          # every record so far, oldest first (every worker's, by time)
  pigeon logs --follow                 # then keep printing new ones
  pigeon logs --type Rejection         # only refusals
  pigeon logs -c /etc/pigeon.toml | jq 'select(.type == "Reception") | .id'
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "logs",
        help="print the event log",
        description="Print the event log as JSON lines (one record per line).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    parser.add_argument("--dir", type=Path, help="log directory (default: [log] path of the configuration)")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing records as they are written")
    parser.add_argument(
        "--type",
        action="append",
        metavar="TYPE",
        help="only records of this type (Reception, Rejection, ...); may be repeated",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    directory = args.dir if args.dir is not None else load_config(args).log.path
    if not directory.is_dir():
        hint = "" if directory.is_absolute() else f" (relative to {Path.cwd()}; give -c FILE or --dir)"
        print(f"pigeon: no log directory at {directory}{hint}", file=sys.stderr)
        return 1
    known = {kind.__name__.lower(): kind.__name__ for kind in RECORD_TYPES}
    wanted = set()
    for kind in args.type or ():
        if kind.lower() not in known:
            print(f"pigeon: no record type {kind!r}; the types are {', '.join(known.values())}", file=sys.stderr)
            return 2
        wanted.add(known[kind.lower()])
    lines = follow(directory) if args.follow else merged_lines(directory)
    decoder = msgspec.json.Decoder(dict[str, Any])
    out = sys.stdout.buffer
    try:
        for line in lines:
            if wanted:
                try:
                    if decoder.decode(line).get("type") not in wanted:
                        continue
                except msgspec.DecodeError:
                    continue
            out.write(line + b"\n")
            if args.follow:
                out.flush()
    except (BrokenPipeError, KeyboardInterrupt):
        return 0
    return 0
