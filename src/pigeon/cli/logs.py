"""`pigeon logs`: print the event log as JSON lines, from every segment, compressed or not."""

from __future__ import annotations

import argparse
import datetime
import functools
import logging
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, Final

import msgspec

from pigeon.cli.common import add_config_option, load_config
from pigeon.config.schema import DURATION_TEXT, DURATION_UNITS
from pigeon.delivery.classify import known_classes
from pigeon.logs.peer_text import shown
from pigeon.logs.reader import follow, merged_lines, segments
from pigeon.logs.records import RECORD_TYPES
from pigeon.message import parse_id
from pigeon.smtp.address import POSTMASTER_PATTERN, a_label, check, same_mailbox_key

EXAMPLES = """examples:
  pigeon logs                          # every record so far, in the order written (see below)
  pigeon logs --follow                 # then keep printing new ones
  pigeon logs --type Rejection         # only refusals
  pigeon logs --recipient bob@example.com --since 2h   # what became of mail to Bob lately
  pigeon logs --domain example.com --type Bounce       # bounces of mail to anyone at example.com
  pigeon logs --id 0000018c2f0a1b2c    # one message's whole story: reception, attempts, outcome,
                                       # and the DSN Pigeon wrote about it (its reception, delivery)
  pigeon logs --since 2026-12-05T09:00 --until 2026-12-05T10:00 --type Bounce
  pigeon logs --classification QuotaIssues --since 1d   # bounces and deferrals for full mailboxes
  pigeon logs -c /etc/pigeon.toml | jq 'select(.type == "Reception") | .id'

Records come as each worker wrote them: when its change was committed, which is mostly but not
strictly the order of their timestamps (they may step back by a fraction of a second, and more
for records written late from the spool's outbox), the workers' streams merged by timestamp;
with --follow, each worker's as it writes them. Nothing is sorted: the output streams. Sort by
.timestamp afterwards where strict time order matters.

Filters combine (a record must pass each); a repeated one matches any of its values.
--since/--until take a time ago ("90s", "30m", "2h", "7d"), an ISO 8601 date or time
(local time unless it names its offset: "2026-12-05", "2026-12-05T09:00", "...T09:00Z"), or
a Unix timestamp. --classification matches a record's bounce class (Bounce, TransientFailure,
Held) without regard to case, as --type does its type. Addresses are compared without regard
to case, and a domain written as its U-label (bücher.example) or its A-label
(xn--bcher-kva.example) is one domain. --sender '' (or '<>') finds the null sender's records,
not those that name no sender. --domain is the recipients' domain (a record with a recipient
there: its attempts, its message's reception, a refused RCPT), that domain alone (not its
subdomains), as `pigeon bounce --domain` selects mail; for a sender's domain, use jq:
  pigeon logs | jq -c 'select(.sender // "" | ascii_downcase | endswith("@example.com"))'

Exits 0; 2 for a usage error: no log directory where --dir or [log] path says, an unknown --type
or --classification (with -c, those of its [delivery] bounce_rules files are known too), an
--id that is not 16 hex digits, a --recipient or --sender that is not local@domain, a --domain
that is not a domain (each would match nothing, for ever), a time it cannot read, an --until
not after --since, --until with --follow.
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
    parser.add_argument(
        "--classification",
        action="append",
        metavar="CLASS",
        help="only records of this bounce class (QuotaIssues, PolicyRelated, ...: a Bounce's, a "
        "TransientFailure's, a Held's), in any case; may be repeated",
    )
    parser.add_argument(
        "--id",
        action="append",
        metavar="ID",
        help="only records of this message id (16 hex digits), and of the DSN Pigeon wrote about it; may be repeated",
    )
    parser.add_argument(
        "--recipient",
        action="append",
        metavar="ADDRESS",
        help="only records about this recipient, local@domain (its attempts, its message's reception); may be repeated",
    )
    parser.add_argument(
        "--domain",
        action="append",
        metavar="DOMAIN",
        help="only records about a recipient at this domain (not its subdomains; not the sender's), "
        "in any case; may be repeated",
    )
    parser.add_argument(
        "--sender",
        action="append",
        metavar="ADDRESS",
        help="only records of this envelope sender (or of mail a policy took from it to another, by its id); "
        "may be repeated",
    )
    parser.add_argument("--since", metavar="WHEN", help='only records from then on ("2h" ago, ISO 8601, Unix time)')
    parser.add_argument("--until", metavar="WHEN", help="only records before then (as --since); not with --follow")
    parser.set_defaults(run=run)


class _Filter:
    """Which records `pigeon logs` prints: each given criterion must hold."""

    def __init__(
        self,
        types: set[str],
        ids: set[str],
        recipients: set[str],
        senders: set[str],
        since: float | None,
        until: float | None,
        classifications: set[str] | None = None,
        domains: set[str] | None = None,
    ) -> None:
        self.types, self.ids, self.recipients, self.senders = types, ids, recipients, senders
        self.domains = domains or set()  # as `a_label` writes them
        self.since, self.until = since, until
        self.classifications = classifications or set()  # lower case
        self.rewritten: set[str] = set()
        """Ids of messages a policy took from a sender asked for (`original_sender`) to another:
        their later records name the new sender alone, and are that mail's all the same."""

    def __call__(self, record: dict[str, Any]) -> bool:
        if self.ids and isinstance(trace := record.get("trace_id"), str) and trace.lower() in self.ids:
            # Received with a message asked for, in one body whose `Received:` field names that
            # message (a reception for several domains): its story is told too, as a DSN about
            # it shows the id asked for.
            self.ids.add(str(record.get("id") or "").lower())
        if self.ids and isinstance(reported := record.get("reports_on"), str) and reported.lower() in self.ids:
            # The DSN Pigeon wrote about a message asked for (its `Reception` names it): its
            # story is part of that message's, as the sender heard of the failure or did not.
            self.ids.add(str(record.get("id") or "").lower())
        original = record.get("original_sender") if self.senders else None
        if isinstance(original, str) and address_key(original) in self.senders and record.get("id"):
            # Before the other filters, as for the ids: `--type Delivery` still follows it.
            self.rewritten.add(str(record["id"]).lower())
        if self.types and record.get("type") not in self.types:
            return False
        if self.classifications:
            classification = record.get("classification")
            if not isinstance(classification, str) or classification.lower() not in self.classifications:
                return False
        if self.since is not None or self.until is not None:
            stamp = record.get("timestamp")
            if not isinstance(stamp, int | float):
                return False
            if (self.since is not None and stamp < self.since) or (self.until is not None and stamp >= self.until):
                return False
        if self.ids and str(record.get("id") or "").lower() not in self.ids:
            return False
        if self.senders:
            # A record without a sender (a command refused before MAIL, a request refused
            # whole) is nobody's: not the null sender's, whom `--sender ''` asks for.
            # A sender the policy changed (a Reception's `original_sender`) finds it too: the
            # client's own records (a Rejection) name that one, and the message's later records
            # (its attempts, its outcome) are found by its id, as its Reception gave it.
            senders = [record.get("sender"), record.get("original_sender")]
            if not any(isinstance(sender, str) and address_key(sender) in self.senders for sender in senders) and (
                not self.rewritten or str(record.get("id") or "").lower() not in self.rewritten
            ):
                return False
        if self.recipients or self.domains:
            named = record.get("recipients")
            addresses = [*named] if isinstance(named, list) else []
            if isinstance(one := record.get("recipient"), str):
                addresses.append(one)
            if self.recipients and not any(isinstance(a, str) and address_key(a) in self.recipients for a in addresses):
                return False
            if self.domains and not any(isinstance(a, str) and domain_key(a) in self.domains for a in addresses):
                return False
        return True


@functools.lru_cache(maxsize=4096)
def address_key(address: str) -> str:
    """What an address given to a filter and one in a record have in common when they name one
    mailbox: any case, and a domain as its A-label, whichever form it was written in
    (`bob@bücher.example` is `bob@xn--bcher-kva.example`), as every other door takes them.
    (Cached: a log names the same few addresses over and over, and IDNA is slow.)"""
    return same_mailbox_key(address.strip().strip("<>")).lower()


@functools.lru_cache(maxsize=4096)
def domain_key(address: str) -> str:
    """The domain of an address in a record, as `a_label` writes it ("" for none: a bare
    postmaster)."""
    local, at, domain = address.strip().strip("<>").rpartition("@")
    return a_label(domain) if at and local else ""


_ID_FORM: Final = "an id is 16 hex digits, as the 250 reply (queued as), pigeon inspect and the log show it"


def _form_problem(option: str, value: str) -> str | None:
    """Why a filter's value can never match a record (not of the form the records write), or
    None. An empty answer would read as "no such mail", for ever: it is a usage error."""
    if option == "--id":
        try:
            parse_id(value.strip())
        except ValueError:
            return f"--id {value!r} is not a message id: {_ID_FORM}"
        return None
    bare = value.strip()
    if option == "--domain":
        local, at, domain = bare.rpartition("@")
        if at and local:
            return f"--domain {value!r} is not a domain: for one recipient, give --recipient {bare}"
        if at and domain and check(f"postmaster@{domain}") is None:
            return f"--domain {value!r} is not a domain: give it alone, --domain {domain}"
        if at or check(f"postmaster@{domain}") is not None:
            return f"--domain {value!r} is not a domain (example.com, or an address literal [192.0.2.1]; no globs)"
        return None
    address = bare[1:-1] if bare.startswith("<") and bare.endswith(">") else bare
    if option == "--sender" and address == "":
        return None  # the null sender
    if re.fullmatch(POSTMASTER_PATTERN, address) is not None:
        return None  # RCPT TO:<postmaster>, with no domain (RFC 5321 4.5.1)
    if address and check(address) is None:
        return None
    form = "local@domain, or '' for the null sender" if option == "--sender" else "local@domain"
    local, at, domain = address.rpartition("@")
    if option == "--recipient" and not local and check(f"postmaster@{domain}") is None:
        return (
            f"--recipient {value!r} is not an address ({form}): for every recipient at a domain, give --domain {domain}"
        )
    return f"{option} {value!r} is not an address ({form})"


def _when(text: str, now: float) -> float:
    """A moment given as time ago ("30m"), an ISO 8601 date, time of day (today's) or both, or
    a Unix timestamp."""
    given = text.strip()
    if (match := DURATION_TEXT.fullmatch(given)) is not None and match.group(2) is not None:
        return now - float(match.group(1)) * DURATION_UNITS[match.group(2)]
    try:
        number = float(given)
    except ValueError:
        pass
    else:
        if math.isfinite(number):
            return number
        raise ValueError(f"{text!r} is no time: give a time ago, an ISO 8601 date or time, or a Unix timestamp")
    iso = given.replace("z", "Z")
    try:
        moment = datetime.datetime.fromisoformat(iso)
    except ValueError:
        try:  # a time of day alone ("09:00", "T09:00:30"): today's, as `date -d` takes it
            day = datetime.date.fromtimestamp(now)
            moment = datetime.datetime.combine(day, datetime.time.fromisoformat(iso))
        except ValueError:
            raise ValueError(
                f'{text!r} is no time: give a time ago ("30m", "2h", "7d"), an ISO 8601 date, time '
                f'of day or both ("2026-12-05", "09:00", "2026-12-05T09:00", "2026-12-05T09:00Z") '
                "or a Unix timestamp"
            ) from None
    return moment.timestamp()  # a naive one is local time, as `date` shows it


def _shown_time(moment: float) -> str:
    """A moment as --since and --until take it, in local time to the second."""
    return datetime.datetime.fromtimestamp(moment).astimezone().isoformat(timespec="seconds")


def run(args: argparse.Namespace) -> int:
    # The configuration for [log] path, and for the classes its `[delivery] bounce_rules` give
    # when --classification is checked against them (with --dir alone, the built-in ones).
    directory: Path = args.dir
    rule_files: list[Path] = []
    if args.dir is None or (args.classification and args.config is not None):
        enough = [("log", "path"), ("delivery", "bounce_rules")] if args.classification else [("log", "path")]
        config = load_config(args, enough=enough)
        directory = args.dir if args.dir is not None else config.log.path
        rule_files = config.delivery.bounce_rules
    if not directory.is_dir():  # a usage error, as every other command's (exit 2)
        given = "--dir" if args.dir is not None else "[log] path"
        why = "is not a directory" if directory.exists() else "does not exist"
        hint = "" if directory.is_absolute() else f" (relative to {Path.cwd()}; give -c FILE or --dir)"
        print(f"pigeon: no log directory: {given} {directory} {why}{hint}", file=sys.stderr)
        return 2
    if not args.follow and not segments(directory):
        # Else nothing printed, exit 0, as for a log without such mail: say there is no log here.
        given = "--dir" if args.dir is not None else "[log] path"
        print(f"pigeon: note: {given} {directory} holds no event log (no *.jsonl segment): nothing to show",
              file=sys.stderr)  # fmt: skip
    known = {kind.__name__.lower(): kind.__name__ for kind in RECORD_TYPES}
    wanted = set()
    for kind in args.type or ():
        if kind.lower() not in known:
            print(f"pigeon: no record type {kind!r}; the types are {', '.join(known.values())}", file=sys.stderr)
            return 2
        wanted.add(known[kind.lower()])
    classes = {name.lower(): name for name in known_classes(rule_files)}
    for name in args.classification or ():
        if name.strip().lower() not in classes:
            # Else nothing printed, exit 0: read as "no mail of that class", for ever.
            ours = "" if args.config is not None else " (give -c FILE for those of its [delivery] bounce_rules files)"
            print(
                f"pigeon: no bounce class {name!r}; the classes are {', '.join(classes.values())}{ours}",
                file=sys.stderr,
            )
            return 2
    for option, values in (("--id", args.id), ("--recipient", args.recipient), ("--sender", args.sender),
                           ("--domain", args.domain)):  # fmt: skip
        for value in values or ():
            if (problem := _form_problem(option, value)) is not None:
                print(f"pigeon: {problem}", file=sys.stderr)
                return 2
    if args.until is not None and args.follow:
        print("pigeon: --until ends what --follow would keep printing: give one of them", file=sys.stderr)
        return 2
    now = time.time()
    try:
        since = _when(args.since, now) if args.since is not None else None
        until = _when(args.until, now) if args.until is not None else None
    except ValueError as error:
        print(f"pigeon: {error}", file=sys.stderr)
        return 2
    if since is not None and until is not None and until <= since:
        # "--since 2h --until 3h" (three hours ago is the earlier): no record can be between
        # them, and an empty answer would read as "nothing happened then".
        print(
            f"pigeon: --until {args.until!r} ({_shown_time(until)}) is not after --since {args.since!r}"
            f" ({_shown_time(since)}): no record is between them",
            file=sys.stderr,
        )
        return 2
    wanted_record = _Filter(
        wanted,
        {value.strip().lower() for value in args.id or ()},
        {address_key(value) for value in args.recipient or ()},
        {address_key(value) for value in args.sender or ()},
        since,
        until,
        {value.strip().lower() for value in args.classification or ()},
        {a_label(value.strip()) for value in args.domain or ()},
    )
    # The reader's warnings (a damaged segment) as the command's own, not as a daemon's log line.
    said = logging.StreamHandler(sys.stderr)
    said.setFormatter(logging.Formatter("pigeon: warning: %(message)s"))
    reader_log = logging.getLogger("pigeon.logs.reader")
    reader_log.addHandler(said)
    reader_log.propagate = False
    lines = follow(directory, since=since) if args.follow else merged_lines(directory, since=since)
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
            if not wanted_record(record):
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
