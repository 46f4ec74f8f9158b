"""`pigeon inject`: send mail through a running node's HTTP API (POST /api/v1/inject)."""

from __future__ import annotations

import argparse
import base64
import json
import math
import mimetypes
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from pigeon import mime
from pigeon.cli.api import ApiClient, Unanswered, add_api_options, fail, printable
from pigeon.cli.common import os_reason
from pigeon.logs.peer_text import shown

EXAMPLES = """examples:
  pigeon inject --from me@example.org --to you@example.net message.eml
  cat message.eml | pigeon inject --from me@example.org --to a@example.net --to b@example.net -
  ... | pigeon inject --from me@example.org --to you@example.net   # as sendmail: stdin, when piped
  pigeon inject --from me@example.org --to you@example.net --template --var code=1234 message.eml
  pigeon inject --from me@example.org --to you@example.net \\
      --subject 'Hello {{ name | default("there") }}' --text 'Your code is {{ code }}.' --var code=1234 \\
      --attach invoice.pdf
  pigeon inject --from me@example.org --to you@example.net --tenant acme --campaign spring --json message.eml

A message file (or stdin) is sent as it is, as sendmail sends it: --template renders it as a
Jinja2 template per recipient. Parts (--subject, --text, --html) are templates (--no-template
sends them as they are). A
variable a template writes out that is not given refuses the recipient rather than sending "Hello ,":
--to names no one, so `name` is given only by --var name=...; {{ name | default("there") }}
(or {{ name or "there" }}) writes a fallback.
Without a message file and parts, the message is read from stdin when that is no terminal
(piped, as an MTA or a script gives it to sendmail); an empty one is refused.
A message file is sent as its bytes: one that is not UTF-8 (8-bit text in a legacy charset)
cannot be a template (--template). A first line "From sender date" (mbox's envelope line,
what an MTA may pipe) is dropped, as sendmail drops it.
Prints each recipient's spool id, or why it was refused.
For a drop-in for sendmail(1) itself (cron, PHP's mail(): -t, -f, -i, no token), see
`pigeon sendmail --help`.

exit status (sysexits.h, as sendmail's):
   0  every recipient was accepted
   1  some recipients were refused: one for good (5xx), or some accepted and others not
      (running it again would send those twice)
   2  usage or input error: a bad option, a file that cannot be read, a request the node
      refused as malformed (400, naming the field), content that fails the content check
      for every recipient (400 naming $.content)
  75  EX_TEMPFAIL: try again later; nothing was accepted: every recipient was refused for now
      (4xx), the node is busy or failing (429, 5xx), or it cannot be reached
  76  EX_PROTOCOL: no answer, after the request was sent (the node, or its worker, went away
      mid-request): some recipients may have been accepted, and running it again would send
      those twice; the node's Reception records say which (the command prints how to look)
  77  EX_NOPERM: the node refused the token (401: none or unknown; 403: no "inject" scope,
      or a tenant its [[http.token]] tenants does not list)
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "inject",
        help="send mail through the HTTP API",
        description="Inject mail into a running Pigeon: a raw message (a file, or stdin) or one built from parts.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_api_options(parser)
    parser.add_argument(
        "message", nargs="?", help="raw RFC 5322 message file, or - for stdin (the default without parts when piped)"
    )
    parser.add_argument("--from", dest="sender", required=True, metavar="ADDRESS", help="envelope sender ('' for <>)")
    parser.add_argument("--to", action="append", required=True, metavar="ADDRESS", help="a recipient; repeat")
    parser.add_argument("--subject", help="build the message: its subject")
    parser.add_argument("--text", help="build the message: its plain text")
    parser.add_argument("--html", type=Path, metavar="FILE", help="build the message: an HTML part from a file")
    parser.add_argument("--attach", action="append", type=Path, default=[], metavar="FILE", help="attach a file")
    parser.add_argument("--header", action="append", default=[], metavar="NAME=VALUE", help="add a header")
    parser.add_argument("--var", action="append", default=[], metavar="NAME=VALUE", help="a template variable")
    template = parser.add_mutually_exclusive_group()
    template.add_argument(
        "--template",
        action="store_true",
        help="render a message file (or stdin) as a Jinja2 template per recipient (by default it goes as it is)",
    )
    template.add_argument(
        "--no-template", action="store_true", help="send parts as they are (a message file or stdin always is)"
    )
    parser.add_argument("--tenant")
    parser.add_argument("--campaign")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        request = _request(args)
    except OSError as error:  # a message file, --html or --attach, or stdin
        what = "stdin" if error.filename is None else error.filename
        print(f"pigeon inject: cannot read {what}: {os_reason(error)}", file=sys.stderr)
        return USAGE
    except ValueError as error:
        print(f"pigeon inject: {error}", file=sys.stderr)
        return USAGE
    # A node that cannot be reached is a temporary failure to a script or an MTA calling us.
    # One that went away once it had the request may have stored some of its recipients.
    unknown = _outcome_unknown(args.sender, time.time(), args.config)
    client = ApiClient(args)
    status, answer = client.request("POST", "/api/v1/inject", request, unreachable=TEMPFAIL, unanswered=unknown)
    per_recipient = isinstance(answer, dict) and isinstance(answer.get("recipients"), list)
    if status not in (200, 422, 503) or not per_recipient:  # 422 and 503 still name each recipient's reply
        fail(status, answer)
        if isinstance(answer, dict) and answer.get("outcome_unknown") is True:
            return unknown("")  # the worker the node's supervisor passed it to went away before it answered
        return failure_status(status)
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        for result in printable(answer["recipients"]):  # a refused address, a policy's reason: escaped
            print(f"{result['email']:40} {result.get('id') or 'refused: ' + result.get('error', '?')}")
    return exit_status(status, answer)


def failure_status(status: int) -> int:
    """The exit status for a request the node answered without a reply per recipient."""
    if status in (401, 403):
        return NOPERM
    if status == 429 or status >= 500:  # busy, restarting, no worker free: the same request may pass later
        return TEMPFAIL
    return USAGE


def exit_status(status: int, answer: dict[str, Any]) -> int:
    """0: every recipient accepted; TEMPFAIL: none was, and all were refused for now (4xx), so
    the same command may simply run again; 1 otherwise (one refused for good, or some accepted:
    running it again would send those twice)."""
    if answer.get("failed") == 0 and status == 200:
        return 0
    results = answer.get("recipients", [])
    refused = [r.get("error") or "" for r in results if not r.get("id")]
    everyone = len(refused) == len(results) > 0
    return TEMPFAIL if everyone and all(error.startswith("4") for error in refused) else REFUSED


REFUSED = 1
USAGE = 2  # as argparse exits for a bad option
TEMPFAIL = 75  # sysexits.h EX_TEMPFAIL: what sendmail and Postfix's sendmail exit with for "try later"
UNKNOWN = 76  # sysexits.h EX_PROTOCOL: the exchange broke off once the node had the request
NOPERM = 77  # sysexits.h EX_NOPERM: "permission denied", for a token the node refuses


def _outcome_unknown(sender: str, started: float, config: Path | None) -> Unanswered:
    """What to say, and exit with, when the request went out and no answer came back: the node
    stores each recipient's message as it goes, so any number of them may be in its spool, to
    be delivered. "Run it again later" (75) would send those twice; the node's log says which."""
    since = math.floor(started) - 1  # (the node's clock and ours: a second's leeway)
    # (`original_sender`: the one given here, where the policy changed the message's sender)
    given = json.dumps(sender)
    program = f'select(.protocol == "HTTP" and (.original_sender // .sender) == {given} and .timestamp >= {since})'
    program += " | {id, recipients}"
    logs = f"pigeon logs{f' -c {shlex.quote(str(config))}' if config is not None else ''} --type Reception"

    def unanswered(what: str) -> int:
        if what:
            print(f"pigeon: {what}", file=sys.stderr)
        print("pigeon: some recipients may have been accepted (stored, to be delivered) before it went: running "
              "this again would send those twice", file=sys.stderr)  # fmt: skip
        print(f"pigeon: which were is in the node's event log once it has been started again: its Reception records "
              f"of protocol HTTP from <{shown(sender)}> since {since} (Unix time), e.g.\n"
              f"  {logs} | jq -c {shlex.quote(program)}\n"
              "pigeon: send the others again", file=sys.stderr)  # fmt: skip
        return UNKNOWN

    return unanswered


def _request(args: argparse.Namespace) -> dict[str, Any]:
    building = any((args.subject, args.text, args.html, args.attach, args.header))
    # Neither a file nor parts: the message comes on stdin, as to sendmail, from an MTA or a
    # script piping it; on a terminal that is a usage error, not a wait for typed mail.
    piped = not building and args.message is None and _stdin_is_piped()
    if building == (args.message is not None or piped):
        raise ValueError(
            "give either a message file (or -, or pipe it on stdin) or parts (--subject, --text, --html, --attach)"
        )
    content: Any
    encoding = None
    # A whole message goes as it is, as sendmail sends what it is given: rendered as a Jinja2
    # template it lost its `{# ... #}` and `{% raw %}` text, or was refused for a `{{ code }}`.
    # Rendering it is asked for (--template); parts are templates, as the API's are.
    template = bool(args.template) if args.message is not None or piped else not args.no_template
    if args.var and not template:
        raise ValueError(
            "--var sets a template variable, but a message file (or stdin) is sent as it is:"
            " add --template to render it as a Jinja2 template"
        )
    if args.message is not None or piped:
        raw = sys.stdin.buffer.read() if piped or args.message == "-" else Path(args.message).read_bytes()
        if not raw and (piped or args.message == "-"):
            raise ValueError("no message: stdin was empty (give a message file, - for stdin, or parts)")
        if not raw:
            raise ValueError(f"no message: {args.message} is empty")
        raw = _without_envelope_line(raw)
        try:
            content = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            if template:
                raise ValueError(
                    f"the message is not UTF-8 (byte 0x{raw[error.start]:02x} at offset {error.start}), so it cannot"
                    " be a template: send it as it is, without --template"
                ) from None
            # Its bytes as they are: a JSON string holds text only, so they go in base64.
            content, encoding = base64.b64encode(raw).decode("ascii"), "base64"
    else:
        content = {"from": {"email": args.sender}, "subject": args.subject or ""}
        if args.text is not None:
            content["text"] = args.text
        if args.html is not None:
            content["html"] = args.html.read_text()
        if args.header:
            content["headers"] = dict(_pair(h, "--header") for h in args.header)
        content["attachments"] = [_attachment(path) for path in args.attach]
    request: dict[str, Any] = {
        "envelope_sender": args.sender,
        "recipients": [{"email": address} for address in args.to],
        "content": content,
        **({"content_encoding": encoding} if encoding else {}),
        "substitutions": dict(_pair(v, "--var") for v in args.var),
        "template": template,
    }
    if args.tenant:
        request["tenant"] = args.tenant
    if args.campaign:
        request["campaign"] = args.campaign
    return request


def _stdin_is_piped() -> bool:
    """True when stdin is open and no terminal (a pipe, a file, /dev/null)."""
    try:
        return sys.stdin is not None and not sys.stdin.isatty()
    except (OSError, ValueError):  # (closed)
        return False


_OBSOLETE_FROM_FIELD = re.compile(rb"From[ \t]*:")


def _without_envelope_line(raw: bytes) -> bytes:
    """`raw` without a first line "From sender date" (mbox's envelope line, no header field:
    it has no colon after its name), which an MTA may pipe and sendmail and Postfix drop.
    ("From : ..." is a From field, in RFC 5322's obsolete syntax: kept.)"""
    if raw.startswith(b"From ") and not _OBSOLETE_FROM_FIELD.match(raw):
        end = raw.find(b"\n")
        return b"" if end < 0 else raw[end + 1 :]
    return raw


def _pair(text: str, option: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise ValueError(f"{option} {text!r}: expected NAME=VALUE")
    return name, value


def _attachment(path: Path) -> dict[str, Any]:
    """A file as an attachment: its bytes in base64, sent as they are. A text file's type
    gets `charset=utf-8` when the bytes are UTF-8 (as most text files are): sent as bytes,
    it would get none, and readers take text/* without one for US-ASCII (mojibake). One in
    another charset is sent without, the charset unknown here."""
    content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    raw = path.read_bytes()
    if content_type.startswith("text/") and mime.is_utf8(raw):
        content_type += "; charset=utf-8"
    data = base64.b64encode(raw).decode()
    return {"data": data, "base64": True, "content_type": content_type, "file_name": path.name}
