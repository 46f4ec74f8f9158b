"""`pigeon logs`: print the event log as JSON lines, from every segment, compressed or not."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import msgspec

from pigeon.cli.common import add_config_option, load_config
from pigeon.logs.peer_text import shown
from pigeon.logs.reader import follow, merged_lines
from pigeon.logs.records import RECORD_TYPES

EXAMPLES = """examples:
  pigeon logs                          # every record so far, oldest first (every worker's, by time)
  pigeon logs --follow                 # then keep printing new ones
  pigeon logs --type Rejection         # only refusals
  pigeon logs -c /etc/pigeon.toml | jq 'select(.type == "Reception") | .id'

Exits 0; 2 for a usage error: no log directory where --dir or [log] path says, an unknown --type.
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
    directory = args.dir if args.dir is not None else load_config(args, enough=[("log", "path")]).log.path
    if not directory.is_dir():  # a usage error, as every other command's (exit 2)
        given = "--dir" if args.dir is not None else "[log] path"
        why = "is not a directory" if directory.exists() else "does not exist"
        hint = "" if directory.is_absolute() else f" (relative to {Path.cwd()}; give -c FILE or --dir)"
        print(f"pigeon: no log directory: {given} {directory} {why}{hint}", file=sys.stderr)
        return 2
    known = {kind.__name__.lower(): kind.__name__ for kind in RECORD_TYPES}
    wanted = set()
    for kind in args.type or ():
        if kind.lower() not in known:
            print(f"pigeon: no record type {kind!r}; the types are {', '.join(known.values())}", file=sys.stderr)
            return 2
        wanted.add(known[kind.lower()])
    # The reader's warnings (a damaged segment) as the command's own, not as a daemon's log line.
    said = logging.StreamHandler(sys.stderr)
    said.setFormatter(logging.Formatter("pigeon: warning: %(message)s"))
    reader_log = logging.getLogger("pigeon.logs.reader")
    reader_log.addHandler(said)
    reader_log.propagate = False
    lines = follow(directory) if args.follow else merged_lines(directory)
    decoder = msgspec.json.Decoder(dict[str, Any])
    out = sys.stdout.buffer
    try:
        for line in lines:
            try:
                record = decoder.decode(line)
            except msgspec.DecodeError:
                # Not a record (a segment damaged by hand or by the disk): said, and kept off
                # stdout, where it would break whatever reads the records (jq).
                text = shown(line.decode("utf-8", "replace"), 80)
                print(f"pigeon: warning: a line of the log is no JSON record, left out: {text}", file=sys.stderr)
                continue
            if wanted and record.get("type") not in wanted:
                continue
            out.write(_printable(line) + b"\n")
            if args.follow:
                out.flush()
    except (BrokenPipeError, KeyboardInterrupt):
        return 0
    return 0


def _printable(line: bytes) -> bytes:
    """A record's line with no character a terminal acts on. JSON escapes only the C0
    controls: DEL, a C1 control (U+009B is CSI) or a bidirectional override in a remote reply
    or an address would reach the screen as it is. Each becomes a JSON escape, which is the
    same string to any JSON reader (such characters only ever stand inside a string)."""
    if line.isascii() and b"\x7f" not in line:
        return line  # the usual record: nothing to do
    text = line.decode("utf-8", "surrogateescape")
    if text.isprintable():
        return line
    return "".join(char if char.isprintable() else _json_escape(char) for char in text).encode(
        "utf-8", "surrogateescape"
    )


def _json_escape(char: str) -> str:
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # beyond the BMP: JSON writes it as a surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
