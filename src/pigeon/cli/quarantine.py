"""`pigeon quarantine`: the spool entries set aside as unreadable, and what can be saved of them.

An entry the spool cannot use (a body file missing or short, an envelope that does not decode)
is never delivered nor dropped: it moves to the `quarantine` table of its shard, with the
reason, and its body stays where it was. This lists them from the spool's files, read-only,
whether the node runs or not (SQLite lets a reader in beside the writer), so an operator can
see what was set aside, then save each message and its envelope to send it again with
`pigeon inject`, and remove the entries it is done with (`--remove`: the only write; the
space of their bodies comes back at the node's next start, when the spool's check finds
bodies nothing refers to).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from pigeon.cli.common import add_config_option, load_config
from pigeon.logs.peer_text import shown
from pigeon.message import ENVELOPE_DECODER, Envelope, format_id, parse_id, shard_of
from pigeon.spool.recovery import SEGMENT_DIR
from pigeon.spool.shards import existing_shards, shard_directory

EXAMPLES = """examples:
  pigeon quarantine -c /etc/pigeon/pigeon.toml            # what was set aside, and why
  pigeon quarantine -c /etc/pigeon/pigeon.toml --json     # one JSON object per line
  pigeon quarantine -c /etc/pigeon/pigeon.toml --save /var/tmp/rescued
      # writes <id>.eml and <id>.json for each entry whose body can still be read, and
      # prints the `pigeon inject` command that sends it again
  pigeon quarantine -c /etc/pigeon/pigeon.toml --remove 0000000000012a00
      # forgets an entry (once sent again, or given up); the node may be running

exit status: 0 the spool was read (with or without entries), or every entry named was
removed; 1 it could not be read, or an entry named is not there; 2 usage or configuration error.
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "quarantine",
        help="list the spool entries set aside as unreadable; save what can be sent again",
        description="List the spool entries set aside as unreadable (read-only: the node may be running).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    parser.add_argument("--spool", type=Path, help="spool directory (default: [spool] path of the configuration)")
    parser.add_argument("--json", action="store_true", help="one JSON object per entry and line")
    parser.add_argument(
        "--save", type=Path, metavar="DIR", help="write each readable entry's message and envelope into DIR"
    )
    parser.add_argument(
        "--remove",
        nargs="+",
        metavar="ID",
        type=_spool_id,
        help="remove these entries (ids as listed); their bodies' space comes back at the node's next start",
    )
    parser.set_defaults(run=run)


def _spool_id(text: str) -> int:
    try:
        return parse_id(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


@dataclass(frozen=True, slots=True)
class Entry:
    """One quarantined entry, as far as its rows and files can still be read."""

    shard: int
    id: int
    at: float
    reason: str
    queue: str | None
    envelope: Envelope | None
    body: bytes | None
    body_problem: str | None

    def as_json(self) -> dict[str, Any]:
        envelope = self.envelope
        return {
            "id": format_id(self.id),
            "shard": self.shard,
            "at": _iso(self.at),
            "reason": self.reason,
            "queue": self.queue,
            "sender": None if envelope is None else envelope.sender,
            "recipients": None if envelope is None else [r.address for r in envelope.recipients],
            "tenant": None if envelope is None else envelope.tenant,
            "campaign": None if envelope is None else envelope.campaign,
            "body_bytes": None if self.body is None else len(self.body),
            "body_problem": self.body_problem,
        }


def run(args: argparse.Namespace) -> int:
    root = args.spool if args.spool is not None else load_config(args, enough=[("spool", "path")]).spool.path
    if not root.is_dir():
        hint = "" if root.is_absolute() else f" (relative to {Path.cwd()}; give -c FILE or --spool)"
        print(f"pigeon: no spool directory at {root}{hint}", file=sys.stderr)
        return 1
    shards = existing_shards(root)
    if not shards:
        print(f"pigeon: {root} holds no spool (no shard-N directory): give -c FILE or --spool", file=sys.stderr)
        return 1
    try:
        entries = [entry for shard in shards for entry in read_shard(shard_directory(root, shard))]
    except sqlite3.Error as error:
        print(f"pigeon: cannot read the spool at {root}: {error}", file=sys.stderr)
        return 1
    if args.remove is not None:
        return _remove(root, args.remove)
    if args.save is not None:
        try:
            args.save.mkdir(parents=True, exist_ok=True)
            probe = args.save / ".pigeon-write-test"
            probe.touch()
            probe.unlink()
        except OSError as error:
            print(f"pigeon: cannot save into {args.save}: {error.strerror}", file=sys.stderr)
            return 1
    config = None if args.config is None else args.config.resolve()
    for entry in entries:
        if args.json:
            # ASCII: DEL and C1 controls from a sender's queue name are escaped like the rest.
            print(json.dumps(entry.as_json()))
        else:
            _print(entry)
        if args.save is not None:
            _save(entry, args.save, config, quiet=args.json)
    if not args.json:
        print(f"{len(entries)} quarantined {'entry' if len(entries) == 1 else 'entries'} in {root}")
    return 0


def read_shard(directory: Path) -> list[Entry]:
    """The quarantined entries of one shard, oldest first. Read-only: the database is opened
    with `mode=ro`, so a running node's shard is read as it stands and never written."""
    database = directory / "spool.db"
    if not database.exists():
        return []
    conn = sqlite3.connect(f"{database.resolve().as_uri()}?mode=ro", uri=True)
    try:
        conn.execute("PRAGMA query_only = 1")
        conn.text_factory = bytes  # a text column that is not UTF-8 may be why an entry is here
        rows = conn.execute(
            "SELECT q.id, q.at, q.reason, q.queue, q.envelope, q.body, b.data, b.size, b.segment, b.at"
            " FROM quarantine q LEFT JOIN body b ON b.id = q.body ORDER BY q.at, q.id"
        ).fetchall()
    finally:
        conn.close()
    entries = []
    for spool_id, at, reason, queue, envelope, body_id, data, size, segment, offset in rows:
        body, problem = _body(directory, body_id, data, size, segment, offset)
        entries.append(
            Entry(
                shard=int(directory.name.removeprefix("shard-")),
                id=spool_id,
                at=at,
                reason=_text(reason) or "",
                queue=_text(queue),
                envelope=_envelope(envelope),
                body=body,
                body_problem=problem,
            )
        )
    return entries


def _remove(root: Path, ids: list[int]) -> int:
    """Delete the quarantine rows of `ids`, each from the shard that made it. A running
    node's worker writes its shard too: SQLite takes turns (WAL, a busy timeout on both
    sides), and nothing of the node's refers to a quarantined entry."""
    missing = 0
    for spool_id in ids:
        name = format_id(spool_id)
        database = shard_directory(root, shard_of(spool_id)) / "spool.db"
        try:
            if not database.exists():
                raise sqlite3.OperationalError(f"no shard {shard_of(spool_id)} (no {database})")
            conn = sqlite3.connect(f"{database.resolve().as_uri()}?mode=rw", uri=True, timeout=10.0)
            try:
                conn.execute("PRAGMA synchronous=FULL")  # said removed: removed for good
                with conn:
                    removed = conn.execute("DELETE FROM quarantine WHERE id = ?", (spool_id,)).rowcount
            finally:
                conn.close()
        except sqlite3.Error as error:
            print(f"pigeon: cannot remove {name} from the spool at {root}: {error}", file=sys.stderr)
            return 1
        if removed:
            print(f"removed {name}")
        else:
            missing += 1
            print(f"pigeon: no quarantined entry {name} in {root}", file=sys.stderr)
    return 1 if missing else 0


def _text(value: object) -> str | None:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else None


def _envelope(blob: object) -> Envelope | None:
    if not isinstance(blob, bytes):
        return None
    try:
        return ENVELOPE_DECODER.decode(blob)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _body(
    directory: Path, body_id: int | None, data: object, size: object, segment: object, offset: object
) -> tuple[bytes | None, str | None]:
    """The body's bytes, or None and why they cannot be had whole."""
    if body_id is None:
        return None, "no body"
    if isinstance(data, bytes):
        return data, None
    if not isinstance(size, int):
        return None, f"body {format_id(body_id)} has no row"
    if isinstance(segment, int) and isinstance(offset, int):
        path = directory / SEGMENT_DIR / format_id(segment)
        try:
            with path.open("rb") as file:
                file.seek(offset)
                read = file.read(size)
        except OSError as error:
            return None, f"{path}: {error.strerror}"
        return (read, None) if len(read) == size else (None, f"{path} ends {size - len(read)} bytes short")
    path = directory / "data" / format_id(body_id)
    try:
        read = path.read_bytes()
    except OSError as error:
        return None, f"{path}: {error.strerror}"
    return (read, None) if len(read) == size else (None, f"{path} has {len(read)} bytes, expected {size}")


def _print(entry: Entry) -> None:
    # Queue names, reasons and addresses come from senders: control characters are shown
    # escaped, never sent to the operator's terminal.
    envelope = entry.envelope
    print(f"{format_id(entry.id)}  shard {entry.shard}  set aside {_iso(entry.at)}")
    print(f"  reason:     {shown(entry.reason, limit=None)}")
    if entry.queue:
        print(f"  queue:      {shown(entry.queue, limit=None)}")
    if envelope is not None:
        print(f"  from:       <{shown(envelope.sender, limit=None)}>")
        print(f"  to:         {shown(', '.join(r.address for r in envelope.recipients), limit=None)}")
    else:
        print("  envelope:   unreadable")
    body = f"{len(entry.body)} bytes, readable" if entry.body is not None else f"unreadable ({entry.body_problem})"
    print(f"  body:       {body}")


def _save(entry: Entry, directory: Path, config: Path | None, *, quiet: bool) -> None:
    """<id>.eml and <id>.json for an entry whose body and envelope can be read; a line that
    says why not otherwise (on stderr under --json, whose stdout is for the entries)."""
    name = format_id(entry.id)
    out = sys.stderr if quiet else sys.stdout
    envelope = entry.envelope
    if entry.body is None or envelope is None:
        why = entry.body_problem if entry.body is None else "its envelope cannot be read"
        print(f"  not saved:  {why}", file=out)
        return
    message = directory / f"{name}.eml"
    try:
        message.write_bytes(entry.body)
        (directory / f"{name}.json").write_text(json.dumps(entry.as_json(), indent=2) + "\n")
    except OSError as error:
        print(f"  not saved:  {error.filename}: {error.strerror}", file=out)
        return
    command = ["pigeon", "inject", *(["-c", str(config)] if config is not None else [])]
    # `--from=...`: an address may start with "-" (`-c/tmp/x.toml@evil.test`), which as a word of
    # its own the command would read as an option of its own.
    command += ["--no-template", f"--from={envelope.sender}"]
    for recipient in envelope.recipients:
        command.append(f"--to={recipient.address}")
    if envelope.tenant:
        command += ["--tenant", envelope.tenant]
    if envelope.campaign:
        command += ["--campaign", envelope.campaign]
    command.append(str(message))
    print(f"  saved:      {message}; to send it again:\n    {' '.join(map(_shell_word, command))}", file=out)


def _shell_word(word: str) -> str:
    """`word` quoted for a POSIX shell; one with control or format characters (a sender's
    choice) as bash's $'...' with escapes, so none of them reaches the terminal raw."""
    if word.isprintable():
        return shlex.quote(word)
    escaped = "".join(
        c if c.isprintable() and c not in "\\'" else f"\\{c}" if c in "\\'" else f"\\U{ord(c):08x}" for c in word
    )
    return f"$'{escaped}'"


def _iso(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat(timespec="seconds")
