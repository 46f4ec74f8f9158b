"""`pigeon bounce | suspend | resume | retry | hold | inspect`: operate on a running node's queues.

Each mirrors an admin API call (see `pigeon.listener.http.admin`); tables for people,
`--json` for scripts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import string
import sys
import urllib.parse
from typing import Any, Final

from pigeon.cli.api import TEMPFAIL, ApiClient, add_api_options, fail, identifier, is_partial, printable
from pigeon.message import format_id, parse_id
from pigeon.node.partial_answer import workers_named

_SELECTOR_HELP = "which messages: at least one of --domain, --tenant, --campaign, --queue (globs allowed)"

BOUNCE_EXAMPLES = """examples:
  pigeon bounce --domain example.net --reason 'list cleaning'      # everything queued for it, now
  pigeon bounce --id 0382610d06800000 --reason 'stuck'             # one message (postsuper -d), now
  pigeon bounce --campaign spring --duration 2h                    # and new spring mail for 2 hours
  pigeon bounce --list                                             # standing bounces
  pigeon bounce --cancel 3f9a1c2b7d4e                              # end one
"""
SUSPEND_EXAMPLES = """examples:
  pigeon suspend --domain gmail.com --duration 30m --reason 'rate limited'
  pigeon suspend --tenant acme                                     # until resumed
  pigeon suspend --site 'mx*.example.net' --duration 10m           # stop deliveries to a site
  pigeon suspend --list
"""
RESUME_EXAMPLES = """examples:
  pigeon resume 3f9a1c2b7d4e                                       # a suspension's id (pigeon suspend --list)
"""
RETRY_EXAMPLES = """examples:
  pigeon retry --domain example.net                                # deferred mail for it is due now
  pigeon retry --id 0382610d06800000 --id 0382610d06840001         # these messages only (postqueue -i)
  pigeon retry --queue 'spring:*'
"""
HOLD_EXAMPLES = """examples:
  pigeon hold --id 0382610d06800000 --reason 'looks like a loop'   # one message (postsuper -h), untried
  pigeon retry --id 0382610d06800000                               # release it (postsuper -H)
  pigeon queue list --state held                                   # what is held, and why

Held mail does not expire while held; released, it is as old as it is: past its queue's max_age, it
expires at its next turn, with the usual DSN to its sender. Only a retry of its id releases it
(`pigeon retry --domain ...` leaves it held); `pigeon bounce --id` ends it.
"""
QUEUE_EXAMPLES = """examples:
  pigeon queue summary                  # per scheduled queue: messages, due, held, suspended, oldest; ready queues
  pigeon queue summary --json | jq '.scheduled[] | select(.messages > 1000)'
  pigeon queue operations               # bulk bounces, retries, rebinds: how far they got
  pigeon queue summary --cluster        # every node's queues (nodes sharing [redis]), added up
"""
REBIND_EXAMPLES = """examples:
  pigeon rebind --domain example.net --routing-domain smarthost.example   # route via another [[route]]
  pigeon rebind --campaign spring --to-queue parked                       # another queue and its policy
  pigeon rebind --campaign ca --domain vip.example --to-queue cb:acme@vip.example
                        # into campaign cb: `suspend --campaign cb` holds it, `bounce --campaign ca` not
"""
INSPECT_EXAMPLES = """examples:
  pigeon inspect 0382610d06800000
  pigeon inspect 0382610d06800000 --json | jq .last_response
  pigeon inspect 0382610d06800000 --headers                        # its header section (postcat -h)
  pigeon inspect 0382610d06800000 --content > msg.eml              # the whole message, as stored (postcat -q)

--content and --headers write the bytes as stored, undecoded: before the edits made as it leaves
(the tenant and campaign headers taken off, the policy's header edits, a submission's added Date
and Message-ID, the DKIM signatures on top).
"""


def register(commands: Any) -> None:
    bounce = _parser(
        commands,
        "bounce",
        "bounce queued mail, no DSN to its sender (and, with --duration, new mail)",
        BOUNCE_EXAMPLES,
        # "Bounce" says "the sender is told" to someone used to other MTAs: this is postsuper -d.
        # (The formatter keeps the description's lines as they are: broken here.)
        "Bounce queued mail (and, with --duration, new mail) without telling its sender: each\n"
        "recipient is written off with an AdminBounce record (with --reason), and the sender gets\n"
        "no DSN, as with Postfix's postsuper -d. A message being sent ends as that attempt leaves\n"
        "it: what it does not deliver is written off when it ends.",
    )
    _selector_options(bounce, by_id="bounced now; no --duration: an id bounce makes no standing rule")
    bounce.add_argument("--reason", default="", help="written into each AdminBounce record")
    bounce.add_argument(
        "--duration", help='also bounce new matching mail for this long ("2h", "30m", "7d", seconds; at most 365d)'
    )
    bounce.add_argument("--list", action="store_true", help="list the standing bounces")
    bounce.add_argument("--cancel", metavar="ID", type=identifier, help="end a standing bounce")
    _cluster_option(bounce, "with --list: every node's standing bounces")
    bounce.set_defaults(run=_bounce)

    suspend = _parser(commands, "suspend", "hold matching mail, untried, until resumed", SUSPEND_EXAMPLES)
    _selector_options(suspend)
    suspend.add_argument("--site", help="instead: stop deliveries to this site (a ready queue), e.g. '127.0.0.1:2526'")
    suspend.add_argument("--reason", default="")
    suspend.add_argument("--duration", help='resume by itself after this long ("30m", "2h", "7d"; at most 365d)')
    suspend.add_argument("--list", action="store_true", help="list the suspensions")
    _cluster_option(suspend, "with --list: every node's suspensions")
    suspend.set_defaults(run=_suspend)

    resume = _parser(commands, "resume", "end a suspension: what it held goes out now", RESUME_EXAMPLES)
    resume.add_argument("id", type=identifier, help="the suspension's id (pigeon suspend --list)")
    resume.set_defaults(run=_resume)

    retry = _parser(commands, "retry", "make matching deferred mail due now", RETRY_EXAMPLES)
    _selector_options(retry, by_id="made due now")
    retry.set_defaults(run=_retry)

    hold = _parser(commands, "hold", "hold queued messages by id, untried, until released", HOLD_EXAMPLES)
    _selector_options(hold, by_id="held until `pigeon retry --id` releases it", ids_only=True)
    hold.add_argument("--reason", default="", help="kept with each message (pigeon inspect), and its AdminHold record")
    hold.set_defaults(run=_hold)

    queue = commands.add_parser("queue", help="look at the queues", description="Look at the queues.")
    actions = queue.add_subparsers(dest="action", required=True, metavar="ACTION")
    summary = _parser(actions, "summary", "scheduled and ready queues, with counts", QUEUE_EXAMPLES)
    _cluster_option(summary, "every node's queues, added up")
    summary.set_defaults(run=_queue_summary)
    operations = _parser(actions, "operations", "recent bulk operations and how far they got", QUEUE_EXAMPLES)
    _cluster_option(operations, "every node's progress, added up")
    operations.set_defaults(run=_operations)
    _register_queue_list(actions)

    rebind = _parser(commands, "rebind", "move matching mail to another queue or route; due now", REBIND_EXAMPLES)
    _selector_options(rebind)
    to_queue = (
        "the scheduled queue to move it to (one name, not a glob; campaign:tenant@domain: selected by those parts)"
    )
    rebind.add_argument("--to-queue", help=to_queue)
    rebind.add_argument("--routing-domain", help='route it as if its recipients were in this domain ("" undoes)')
    rebind.set_defaults(run=_rebind)

    inspect = _parser(commands, "inspect", "show one message: envelope, state, attempts, next try", INSPECT_EXAMPLES)
    inspect.add_argument("id", type=identifier, help="spool id, 16 hex digits (from the 250 reply or the logs)")
    _stored_options(inspect)
    inspect.set_defaults(run=_inspect)


def _parser(
    commands: Any, name: str, summary: str, examples: str, description: str | None = None
) -> argparse.ArgumentParser:
    """A command's parser: `summary` in the command list, and its help's description unless
    `description` says more."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=summary,
        description=description or summary[0].upper() + summary[1:] + ".",
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_api_options(parser)
    return parser


def _cluster_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--cluster", action="store_true", help=f"{what} (nodes sharing [redis])")


def cluster_path(args: argparse.Namespace, path: str) -> str:
    """`path`, asking for every node's answer if --cluster was given."""
    return path + "?cluster=1" if getattr(args, "cluster", False) else path


def _selector_options(parser: argparse.ArgumentParser, by_id: str | None = None, *, ids_only: bool = False) -> None:
    """The selector's options; with `by_id` (what becomes of them), `--id` too (`ids_only`: it
    is required, and the others only narrow what it names)."""
    if by_id is None:
        group = parser.add_argument_group("selector", _SELECTOR_HELP)
    elif ids_only:
        text = "which messages: --id, at least one; with --domain, --tenant, --campaign or --queue too, those of "
        group = parser.add_argument_group("selector", text + "the ids they select")
    else:
        text = "which messages: --id, or at least one of --domain, --tenant, --campaign, --queue (globs allowed); "
        group = parser.add_argument_group("selector", text + "with both, those of the ids they select")
    for name in ("domain", "tenant", "campaign", "queue"):
        group.add_argument(f"--{name}")
    if by_id is not None:
        group.add_argument(
            "--id",
            dest="messages",
            action="append",
            metavar="ID",
            type=message_id,
            help=f"a message's id (16 hex digits, as the 250 reply, `pigeon logs` and `pigeon inspect` show it), "
            f"on whichever worker or node holds it; may be repeated: {by_id}",
        )


def message_id(value: str) -> str:
    """An argparse type for a message's spool id, as Pigeon prints it (16 hex digits)."""
    try:
        return format_id(parse_id(value))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _selector(args: argparse.Namespace) -> dict[str, Any]:
    names = ("domain", "tenant", "campaign", "queue", "site", "messages")
    return {k: getattr(args, k) for k in names if getattr(args, k, None)}


def _bounce(args: argparse.Namespace) -> int:
    if args.cluster and not args.list:
        return _cluster_without_list("bounce")
    if (refused := _alone(args, "bounce", "list", "cancel")) is not None:
        return refused
    client = ApiClient(args)
    if args.list:
        return _show_rules(args, *client.request("GET", cluster_path(args, "/api/v1/admin/bounce")))
    if args.cancel:
        answer = client.request("DELETE", f"/api/v1/admin/bounce/{args.cancel}")
        return _show(args, *answer, "cancelled standing bounce {cancel}", cancel=args.cancel)  # not "cancelled True"
    body = {**_selector(args), "reason": args.reason, **({"duration": args.duration} if args.duration else {})}
    status, answer = client.request("POST", "/api/v1/admin/bounce", body)
    said = _said_by_workers(status, answer)
    text = "bounced {bounced:count message}"
    sent = said.get("after_attempt") or 0
    if sent:
        # `bounced` counts them too: the headline says what is bounced now, and the rest apart
        # (all 6 of "bounced 6 messages" were delivered by the attempt under way).
        text = "bounced {now:count message} now; {after_attempt} being sent: "
        text += "bounced only if that attempt does not deliver " + ("it" if sent == 1 else "them")
    text += "; new mail too until {until} (rule {rule_id})" if args.duration else ""
    text += _each_message(said, _BOUNCE_RESULTS, args)
    return _show(args, status, answer, text, now=int(said.get("bounced") or 0) - int(sent))


_BOUNCE_RESULTS: Final = {
    "bounced": "bounced ({recipients})",
    "after_attempt": "being sent: bounced as far as that attempt does not deliver it ({recipients})",
}
_RETRY_RESULTS: Final = {
    "made_due": "due now",
    "already_due": "due already: waiting for a connection, or being sent",
    "hold_cancelled": "being sent: the hold asked meanwhile is cancelled; what that attempt does not deliver is "
    "retried as usual",
    "suspended": "left held by a suspension (`pigeon suspend --list`, then `pigeon resume ID`)",
    "held": "left held: held by someone this token cannot release (`pigeon inspect` says who)",
    "bounced": "bounced instead (a standing bounce covers it, `pigeon bounce --list`; or, being sent, it was "
    "bounced meanwhile: bounced as far as that attempt does not deliver it)",
}
_NOT_FOUND: Final = "not found: delivered, bounced or expired already, or no such message"


def _not_selected(unmatched: Any, args: argparse.Namespace) -> str:
    """ "queued, but not selected by --domain other.example": the options given with the ids
    that miss it (not "not found": it is queued, and left as it is)."""
    names = [str(name) for name in unmatched] if isinstance(unmatched, list) else []
    given = [f"--{name} {getattr(args, name)}" if getattr(args, name, None) else f"--{name}" for name in names]
    return "queued, but not selected by " + (" ".join(given) or "the selector given") + ": left as it is"


def _pending(nodes: Any, cluster: dict[str, Any]) -> str:
    """ "not found on the nodes that answered; node b is not running: ...": an id no node that
    answered holds, while some did not answer (it may be on one of those, which acts on it later)."""
    names = [str(node) for node in nodes] if isinstance(nodes, list) else []
    stopped = cluster.get("not_running") or {}
    why = [
        f"node {node} is not running: applied there when it starts, if it holds it"
        if node in stopped
        else f"node {node} did not answer in time: applied there when it gets to it, if it holds it"
        for node in names
    ]
    return "; ".join(["not found on the nodes that answered", *why]) + " (within [redis] late_operations)"


def _unreached(nodes: Any) -> str:
    """ "not found on node b; the other nodes were not reached ...": an id the node asked does not
    hold while Redis cannot be reached (`unknown`): another node may hold it, and was not told."""
    names = ", ".join(str(node) for node in nodes) if isinstance(nodes, list) and nodes else "the node asked"
    return (f"not found on node {names}; the other nodes were not reached (Redis cannot be reached): one of them "
            "may hold it, and knows nothing of this; issue it again once Redis answers")  # fmt: skip


def _each_message(said: dict[str, Any], results: dict[str, str], args: argparse.Namespace) -> str:
    """What became of each message named by id (`--id`), a line each, after the headline; ""
    when none was. (Part of a format string: its braces doubled.)"""
    rows = said.get("messages")
    if not isinstance(rows, list):
        return ""
    lines = []
    cluster: dict[str, Any] = said["cluster"] if isinstance(said.get("cluster"), dict) else {}
    for row in printable(rows):  # (an id as a node answered it: its words, not ours)
        result = str(row.get("result"))
        recipients = _COUNTED.format("{0:count recipient}", row.get("recipients") or 0)
        text = results.get(result, _NOT_FOUND if result == "not_found" else result).format(recipients=recipients)
        if result == "not_selected":
            text = _not_selected(row.get("unmatched"), args)
        elif result == "pending":
            text = _pending(row.get("pending_on"), cluster)
        elif result == "unknown":
            text = _unreached(row.get("not_found_on"))
        if row.get("node"):  # (with [redis]: the node that holds it, whose `pigeon inspect` shows it)
            text = f"node {row['node']}: {text}"
        lines.append(f"\n  {row.get('id')}  {text}")
    return "".join(lines).replace("{", "{{").replace("}", "}}")


def _suspend(args: argparse.Namespace) -> int:
    if args.cluster and not args.list:
        return _cluster_without_list("suspend")
    if (refused := _alone(args, "suspend", "list")) is not None:
        return refused
    client = ApiClient(args)
    if args.list:
        return _show_rules(args, *client.request("GET", cluster_path(args, "/api/v1/admin/suspend")))
    body = {**_selector(args), "reason": args.reason, **({"duration": args.duration} if args.duration else {})}
    status, answer = client.request("POST", "/api/v1/admin/suspend", body)
    said = _said_by_workers(status, answer)
    if said.get("already"):
        return _show(args, status, answer, "already suspended until {until} by rule {rule_id}; nothing added")
    if said.get("added_on"):
        # In force on some workers only: it is added where it lacked, which is not "nothing added".
        text = "suspended until {until} (rule {rule_id}) on worker(s) {workers}, which lacked it (the others held it "
        text += "already); {held:count message} held"
        return _show(args, status, answer, text, workers=", ".join(map(str, said["added_on"])))
    return _show(args, status, answer, "suspended until {until} (rule {rule_id}); {held:count message} held")


def _alone(args: argparse.Namespace, command: str, *actions: str) -> int | None:
    """2 if one of `actions` (--list, --cancel) was given with what only a new rule takes (a
    selector, --reason, --duration) or with another of them: said rather than ignored, as
    `pigeon suspend --list --domain x` listed every suspension, not those of x."""
    given = [action for action in actions if getattr(args, action)]
    if not given:
        return None
    making = ("domain", "tenant", "campaign", "queue", "site", "messages", "reason", "duration")
    others = [_option(name) for name in (*making, *actions) if name != given[0] and getattr(args, name, None)]
    if not others:
        return None
    hint = " (it shows every rule: filter its --json output for some)" if given[0] == "list" else ""
    print(f"pigeon {command}: --{given[0]} takes no {', '.join(others)}{hint}", file=sys.stderr)
    return 2


def _option(name: str) -> str:
    return "--id" if name == "messages" else f"--{name}"


def _said_by_workers(status: int, answer: Any) -> dict[str, Any]:
    """What a write's text is made from, as `_show` formats it: the answer, or for a partial one
    what the workers that answered said together (`answers`): its qualifiers ("6 being sent now")
    are theirs, said as a whole answer's would be; {} for an answer that is no object."""
    said = answer["answers"] if is_partial(status, answer) and "answers" in answer else answer
    return said if isinstance(said, dict) else {}


def _cluster_without_list(command: str) -> int:
    # Said rather than ignored: whoever typed it may believe that without it only this node acts.
    print(f"pigeon {command}: --cluster goes with --list; a {command} applies on every node sharing "
          "[redis] without it", file=sys.stderr)  # fmt: skip
    return 2


def _resume(args: argparse.Namespace) -> int:
    status, answer = ApiClient(args).request("DELETE", f"/api/v1/admin/suspend/{args.id}")
    text = "resumed: {made_due:count message} due now"
    if _said_by_workers(status, answer).get("bounced"):
        text += "; {bounced:count message} bounced instead (a standing bounce covers them: `pigeon bounce --list`)"
    if _said_by_workers(status, answer).get("suspended"):
        # (Another suspension holds them: to a token bound to tenants, perhaps the operator's.)
        text += "; {suspended:count message} left held by another suspension (`pigeon suspend --list`)"
    return _show(args, status, answer, text)


def _retry(args: argparse.Namespace) -> int:
    status, answer = ApiClient(args).request("POST", "/api/v1/admin/retry", _selector(args))
    said = _said_by_workers(status, answer)
    text = "{made_due:count message} due now"
    if said.get("suspended"):
        text += "; {suspended} left held by a suspension (`pigeon suspend --list`, then `pigeon resume ID`)"
    if said.get("bounced"):
        # (A bounce asked while a message was being sent is not taken back by a retry either.)
        text += ("; {bounced:count message} bounced instead (a standing bounce covers them, `pigeon bounce --list`, "
                 "or an operator bounced them while they were being sent)")  # fmt: skip
    if said.get("on_hold") and args.messages:
        # (Named by id: a token bound to tenants, and a hold it cannot release, the operator's.)
        text += "; {on_hold:count message} left held by someone this token cannot release"
    elif said.get("on_hold"):
        text += "; {on_hold:count message} left held by an operator (`pigeon hold`: release each by its --id)"
    text += _each_message(said, _RETRY_RESULTS, args)
    return _show(args, status, answer, text)


_HOLD_RESULTS: Final = {
    "held": "held ({recipients}): `pigeon retry --id` releases it",
    "after_attempt": "being sent: held as far as that attempt does not deliver it ({recipients})",
    "already_held": "held already: left as it is (`pigeon inspect` says why)",
}


def _hold(args: argparse.Namespace) -> int:
    if not args.messages:
        # Said rather than guessed: holding what a selector matches is a suspension's work.
        print("pigeon hold: name the messages with --id (to hold mail by domain, tenant, campaign or queue: "
              "pigeon suspend)", file=sys.stderr)  # fmt: skip
        return 2
    body = {**_selector(args), "reason": args.reason}
    status, answer = ApiClient(args).request("POST", "/api/v1/admin/hold", body)
    said = _said_by_workers(status, answer)
    text = "held {held:count message}"
    sent = said.get("after_attempt") or 0
    if sent:
        text = "held {now:count message} now; {after_attempt} being sent: "
        text += "held only if that attempt does not deliver " + ("it" if sent == 1 else "them")
    text += _each_message(said, _HOLD_RESULTS, args)
    return _show(args, status, answer, text, now=int(said.get("held") or 0) - int(sent))


def _rebind(args: argparse.Namespace) -> int:
    body = _selector(args)
    if args.to_queue is not None:
        body["to_queue"] = args.to_queue
    if args.routing_domain is not None:
        body["routing_domain"] = args.routing_domain
    status, answer = ApiClient(args).request("POST", "/api/v1/admin/rebind", body)
    text = "rebound {rebound:count message} ({after_attempt} once their attempt under way ends)"
    if _said_by_workers(status, answer).get("inbound_left"):
        text += "; {inbound_left:count message} of [[inbound]] routes left as they are: they go to their target"
    if _said_by_workers(status, answer).get("held_left"):
        # (a token bound to tenants: the operator's suspension or standing bounce, not named)
        text += "; {held_left:count message} left in place, held by a suspension or standing bounce this token " \
            "cannot end (`pigeon suspend --list`)"  # fmt: skip
    if _said_by_workers(status, answer).get("reserved_left"):
        # (moved, they would bounce at their next attempt: never sent under another tenant's account)
        domain = args.routing_domain.replace("{", "{{").replace("}", "}}")  # (the text is a format)
        text += f"; {{reserved_left:count message}} left in place: the [[route]] of {domain} is " \
            "reserved for other tenants than theirs ([[route]] tenants); moved there they would bounce"  # fmt: skip
    return _show(args, status, answer, text)


_POOL_CHOOSERS = {"policy": "named by the policy hook", "queue": "its [[queue]]'s pool", "delivery": "[delivery] pool"}


def _inspect(args: argparse.Namespace) -> int:
    if args.headers or args.content:
        return _inspect_stored(args)
    status, answer = ApiClient(args).request("GET", f"/api/v1/messages/{args.id}")
    if status != 200 or args.json:
        return _show(args, status, answer, "")
    answer = printable(answer)  # the last response is a remote server's words
    answer = _subject_after_recipients(answer)  # (its sender's words: escaped as the rest)
    chooser = _POOL_CHOOSERS.get(answer.pop("egress_pool_from", None) or "")
    if answer.get("egress_pool") and chooser:
        answer["egress_pool"] = f"{answer['egress_pool']} ({chooser})"
    for key, value in answer.items():
        if key in ("created", "next_due", "held_until") and isinstance(value, int | float):
            # The date and its Unix time name the same second: the date's, cut (not rounded) to it.
            whole = math.floor(value) if math.isfinite(value) else value
            value = f"{_when(whole)} ({whole:.0f})"
        elif isinstance(value, list):
            value = ", ".join(map(str, value)) if value else None
        elif isinstance(value, dict):  # metadata: key=value, not a repr that escapes again
            value = ", ".join(f"{k}={v}" for k, v in value.items()) if value else None
        if value is not None:
            print(f"{key:14} {value}")
    return 0


def _stored_options(inspect: argparse.ArgumentParser) -> None:
    stored = inspect.add_mutually_exclusive_group()
    stored.add_argument(
        "--headers", action="store_true", help="write its header section to stdout, bytes as stored (postcat -h)"
    )
    stored.add_argument(
        "--content",
        action="store_true",
        help="write the whole message to stdout, bytes as stored, before the edits made as it leaves (postcat -q)",
    )


def _inspect_stored(args: argparse.Namespace) -> int:
    """`inspect --headers | --content`: the stored bytes to stdout as they come, undecoded (a
    message of gigabytes is not held), so `> msg.eml` is the message; an error to stderr."""
    if args.json:
        print(
            "pigeon inspect: --json goes with neither --headers nor --content (they write the bytes)", file=sys.stderr
        )
        return 2
    part = "headers" if args.headers else "content"
    sys.stdout.flush()
    status, raw = ApiClient(args).fetch(f"/api/v1/messages/{args.id}/{part}", sink=sys.stdout.buffer)
    if status != 200:
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = {"error": raw.decode(errors="replace")}
        return fail(status, answer)
    sys.stdout.buffer.flush()
    return 0


def _subject_after_recipients(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer with its `subject` shown after the recipients, with the envelope."""
    subject = answer.pop("subject", None)
    shown: dict[str, Any] = {}
    for key, value in answer.items():
        shown[key] = value
        if key == "recipients":
            shown["subject"] = subject
    return shown


def _queue_summary(args: argparse.Namespace) -> int:
    status, answer = ApiClient(args).request("GET", cluster_path(args, "/api/v1/queues"))
    if (status >= 400 and not _partly(args, status, answer)) or args.json:
        return _show(args, status, answer, "")
    whole, answer = answer, printable(answer.get("answers", answer))  # queue names, reasons: anyone's
    not_held = answer.get("not_held", {})  # which workers lack a suspension, as `suspend --list` says
    now = datetime.datetime.now(datetime.UTC).timestamp()
    # Names whole, however long (a campaign, a Gmail site): a cut one cannot be told from its
    # neighbours nor pasted into --queue or --site.
    width = max([44, *(len(row["queue"]) for row in answer["scheduled"])])
    # "held": mail an operator releases (`pigeon retry`: held [[inbound]] mail, `pigeon hold`'s);
    # "suspended": mail a suspension holds (`pigeon resume`), as `pigeon suspend` counted it.
    # "later": waiting for a time (a retry, a suspension's next look), the first one "next".
    print(f"{'scheduled queue':{width}} {'messages':>9} {'due':>7} {'later':>7} {'next':>7} {'held':>6} "
          f"{'suspended':>9} {'ready':>6} {'in flight':>9}  {'oldest':7} suspended by")  # fmt: skip
    for row in answer["scheduled"]:
        age = _age(now - row["oldest"])
        following = row.get("next_due")
        upcoming = "-" if following is None else "now" if following <= now else _age(following - now)
        print(f"{row['queue']:{width}} {row['messages']:>9} {row['due']:>7} {row.get('later', 0):>7} "
              f"{upcoming:>7} {row.get('held', 0):>6} {row.get('suspended', 0):>9} {row.get('ready', 0):>6} "
              f"{row.get('in_flight', 0):>9}  {age:7} {_suspended_by(row, not_held)}")  # fmt: skip
    width = max([52, *(len(row["path"]) for row in answer["ready"])])
    print(f"\n{'ready queue':{width}} {'queued':>8} {'connections':>11}  {'provider':12} reactions' effects")
    for row in answer["ready"]:
        effects = [_effect_text(effect) for effect in row.get("effects", ())]
        if row.get("suspended_by"):
            effects.append(f"suspended by {_suspended_by(row, not_held)}")
        if row.get("down"):  # no host of the site takes a connection: its mail waits for a probe
            effects.insert(0, "site down")
        provider = row.get("provider") or "-"
        print(f"{row['path']:{width}} {row['queued']:>8} {row['connections']:>11}  {provider:12} "
              f"{', '.join(effects) or '-'}")  # fmt: skip
    left_out = _show_nodes(answer, args)
    return fail(status, whole) if status >= 400 else _complete(left_out)


QUEUE_LIST_EXAMPLES = """examples:
  pigeon queue list                             # every queued message, oldest first (Postfix's mailq)
  pigeon queue list --state deferred --domain example.net
  pigeon queue list --limit 50 --after 0382610d06800000       # the next 50 after the last one shown
  pigeon queue list --json | jq -r '.messages[] | select(.attempts > 3) | .id'
"""
_LIST_PAGE = 1000  # the most a request asks for (`pigeon.queue.listing.MAX_LIMIT`)
_LIST_RECIPIENTS = 3  # addresses a message's text names; the rest are counted


def _register_queue_list(actions: Any) -> None:
    listing = _parser(
        actions, "list", "the queued messages, oldest first, and why they wait (Postfix's mailq)", QUEUE_LIST_EXAMPLES
    )
    group = listing.add_argument_group("selector", "which messages (globs allowed; none: all)")
    for name in ("domain", "tenant", "campaign", "queue"):
        group.add_argument(f"--{name}")
    states = "deferred, suspended, held, due, scheduled, ready, in_flight, settling"
    listing.add_argument("--state", help=f"only these states, comma-separated: {states}")
    listing.add_argument("--limit", type=_positive, default=1000, help="show at most this many (default 1000)")
    listing.add_argument(
        "--after",
        metavar="ID",
        type=identifier,
        help="start after this message (paging on; with a --token bound to tenants, the cursor the last list named)",
    )
    listing.set_defaults(run=_queue_list)


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:  # ASCII digits: "١٠" is no number here
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def _queue_list(args: argparse.Namespace) -> int:
    client = ApiClient(args)
    shown: list[dict[str, Any]] = []
    after: str | None = args.after
    while True:
        query = {**_selector(args), "limit": str(min(_LIST_PAGE, args.limit - len(shown)))}
        if args.state:
            query["state"] = args.state
        if after:
            query["after"] = after
        status, answer = client.request("GET", "/api/v1/messages?" + urllib.parse.urlencode(query))
        if status >= 400:
            return _show(args, status, answer, "")
        shown += answer["messages"]
        after = answer.get("next")
        if after is None or len(shown) >= args.limit:
            break
    if args.json:
        print(json.dumps({"messages": shown, "next": after}, indent=2))
        return 0
    now = datetime.datetime.now(datetime.UTC).timestamp()
    for message in printable(shown):
        print(_listed(message, now))
    more = f"; more after it: pigeon queue list --after {after}" if after else ""
    size = sum(message["size"] for message in shown)
    print(f"-- {_COUNTED.format('{0:count message}', len(shown))}, {_size(size)}{more}")
    return 0


def _listed(message: dict[str, Any], now: float) -> str:
    """A message as `pigeon queue list` prints it: like mailq's, its id, size, arrival and sender,
    then why it waits (its state, queue, attempts, next try and last reply), then its recipients."""
    created = message["created"]
    arrival = f"{_when(created)} ({_age(now - created)})"
    head = f"{message['id']}  {message['state']:9} {_size(message['size']):>7}  {arrival}"
    lines = [f"{head}  {message['sender'] or '<>'}"]
    due = message.get("next_due")
    following = "-" if due is None else "now" if due <= now else f"in {_age(due - now)}"
    why = f"queue {message['queue']}, {_COUNTED.format('{0:count attempt}', message['attempts'])}, "
    if message["state"] == "suspended" and message.get("suspended_by"):
        # Held: when a suspension looks at it again is no next try; it goes at its end, or a resume.
        why += f"suspended ({message['suspended_by']})" + (" until resumed" if due is None else f", next {following}")
    else:
        why += f"next {following}"
        if message.get("suspended_by"):
            why += f", suspended by rule {message['suspended_by']}"
    lines.append(f"    {why}")
    held = message.get("held")
    if held and held != message.get("last_response"):
        # Why it waits for an operator: their hold and reason (an [[inbound]] refusal is its last reply).
        lines.append(f"    {held}; `pigeon retry --id {message['id']}` releases it")
    if message.get("last_response"):
        lines.append(f"    ({message['last_response']})")
    recipients = message["recipients"][:_LIST_RECIPIENTS]
    rest = message["recipient_count"] - len(recipients)
    lines.append("    " + ", ".join(recipients) + (f" (+{rest} more)" if rest else ""))
    return "\n".join(lines)


def _size(size: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f}{unit}"
    return f"{size}B"


def _suspended_by(row: dict[str, Any], not_held: dict[str, list[int]]) -> str:
    """Who suspended a queue and why, from its row: "ops via api: rate limited (rule 3f9a1c2b7d4e)", or "-";
    "[not held on worker 0]" after a rule some workers lack (`not_held`: their share goes out)."""
    held = []
    for rule in row.get("suspended_by", ()):
        reason = f": {rule['reason']}" if rule.get("reason") else ""
        via = f" via {rule['via']}" if rule.get("via") else ""
        lacking = ", ".join(f"worker {index}" for index in not_held.get(rule["id"], ()))
        missing = f" [not held on {lacking}]" if lacking else ""
        held.append(f"{rule.get('operator') or '?'}{via}{reason} (rule {rule['id']}){missing}")
    return "; ".join(held) or "-"


def _effect_text(effect: dict[str, Any]) -> str:
    """ "suspend until 10:04:05 (rule gmail-421)", "limit 2 connections, 5/s until ..."."""
    action = effect["action"]
    if action == "limit":
        limits = []
        if effect.get("connection_limit") is not None:
            limits.append(_COUNTED.format("{0:count connection}", effect["connection_limit"]))
        if effect.get("max_message_rate") is not None:
            limits.append(str(effect["max_message_rate"]))
        action = f"limit {', '.join(limits)}"
    return f"{action} until {_when(effect['expires_at'])} (rule {effect['rule']})"


def _operations(args: argparse.Namespace) -> int:
    status, answer = ApiClient(args).request("GET", cluster_path(args, "/api/v1/admin/operations"))
    if (status >= 400 and not _partly(args, status, answer)) or args.json:
        return _show(args, status, answer, "")
    whole, answer = answer, printable(answer.get("answers", answer))
    # "after attempt": of those acted on, how many were being sent (acted on as far as that attempt
    # leaves them: a bounce does not undo a delivery).
    # The kind column is as wide as the longest kind listed ("retry after a reload changed the
    # routes"), so that the counts stay under their headings.
    kind = max([8, *(len(str(row["kind"])) for row in answer["operations"])])
    counted = f"{'looked at':>10} {'acted on':>10} {'after attempt':>14} {'waited':>7}"
    print(f"{'operation':14} {'kind':{kind}} {counted}  state")
    for row in answer["operations"]:
        state = f"running on {row['running']} worker(s)" if row["running"] else f"done {_when(row['finished'])}"
        counts = f"{row['looked_at']:>10,} {row['acted_on']:>10,} {row.get('after_attempt', 0):>14,}"
        counts += f" {row.get('waited', 0):>7,}"
        print(f"{row['operation']:14} {row['kind']:{kind}} {counts}  {state}")
    left_out = _show_nodes(answer, args)
    return fail(status, whole) if status >= 400 else _complete(left_out)


def _age(seconds: float) -> str:
    """An age or a wait as `queue list` and `queue summary` show it: whole seconds below a
    minute, then minutes, hours and days to one decimal. The unit is chosen by the value as
    shown, not as it is: 59.6 s is "1.0m" as 60.3 s is, never "60s" beside it (nor "60.0m",
    "24.0h"), so an older message never looks younger."""
    if (whole := round(seconds)) < 60:
        return f"{whole}s"  # (an int: "0s", not "-0s", for a clock a hair behind)
    for unit, size, limit in (("m", 60, 60), ("h", 3600, 24)):
        shown = f"{seconds / size:.1f}"
        if float(shown) < limit:
            return f"{shown}{unit}"
    return f"{seconds / 86400:.1f}d"


class _Counted(string.Formatter):
    """`str.format`, and a spec `count NOUN` that gives "1 NOUN", "0 NOUNs", "2 NOUNs"."""

    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec.startswith("count "):
            noun = format_spec.removeprefix("count ")
            return f"{value} {noun}{'' if value == 1 else 's'}"
        return str(super().format_field(value, format_spec))


_COUNTED: Final = _Counted()


def _show(args: argparse.Namespace, status: int, answer: Any, text: str, **more: Any) -> int:
    if is_partial(status, answer) and "answers" in answer:
        # Some workers did not answer: what the others did is said, then which are missing.
        if args.json:
            print(json.dumps(answer, indent=2))
        elif text:
            answered = answer.get("answered")
            named = workers_named(answered) if isinstance(answered, list) else f"workers {answered}"
            print(f"{named} only: ", end="")
            _show(args, 200, answer["answers"], text, **more)
        return fail(status, answer)
    if status >= 400:
        return fail(status, answer)
    if args.json:
        print(json.dumps(answer, indent=2))
        return _complete(_left_out(answer))
    answer = printable(answer)
    rule = answer.get("rule") or {}
    expires = rule.get("expires")
    until = _when(expires) if expires else "resumed"
    print(_COUNTED.format(text, **answer, rule_id=rule.get("id"), until=until, **more))
    return _complete(_show_nodes(answer))


AT_START: Final = "at_start"  # (`pigeon.node.broadcast.AT_START`: not imported, it brings Redis's client)
_STATES: Final = {AT_START: "will apply at start"}
"""How a node's state in a cluster's answer (`cluster.nodes`) is said, where not as it is."""

NOT_A_CLUSTER = "this node only: it has no [redis] url, so there is no cluster to ask"


def _show_nodes(answer: Any, args: argparse.Namespace | None = None) -> dict[str, list[str]]:
    """Which nodes the answer adds up (a cluster's), and what could not be told; for a read
    asked of the cluster (`args.cluster`), that a node without Redis answered for itself. The
    nodes it leaves out (`_left_out`), each said with what that means for the operator."""
    cluster = answer.get("cluster") if isinstance(answer, dict) else None
    if not cluster:
        if args is not None and getattr(args, "cluster", False):
            print(f"note: {NOT_A_CLUSTER}")
        return {}
    nodes = ", ".join(
        f"{node} ({_STATES.get(state, state)})" for node, state in sorted(cluster.get("nodes", {}).items())
    )
    print(f"nodes: {nodes}")
    if cluster.get("error"):
        print(f"warning: {cluster['error']}")
    left_out = _left_out(answer)
    stopped = cluster.get("not_running") or {}
    late = [node for node in left_out.get("pending", []) if node not in stopped]
    if late:
        print(f"warning: {_names(late)} did not answer in time, and not counted above: a pending node "
              "applies it when it comes back (a bounce of what is queued, a retry, a rebind or a hold by id only "
              "within [redis] late_operations of now; see `pigeon queue operations --cluster`)")  # fmt: skip
    for node, at in sorted(stopped.items()):
        since = f" (stopped, or gone, at {_when(at)})" if isinstance(at, int | float) else ""
        if cluster.get("nodes", {}).get(node) == AT_START:
            # A rule, or its end: Redis keeps it, and the node takes it before it delivers anything.
            print(f"note: node {node} is not running{since}: it takes the cluster's suspensions and standing "
                  "bounces as they are then, this change included, when it starts, before it delivers anything "
                  "(a rule that has ended by then is not taken)")  # fmt: skip
            continue
        print(f"warning: node {node} is not running{since}, and not counted above: it applies it when it starts "
              "(a bounce of what is queued, a retry, a rebind or a hold by id only within [redis] late_operations "
              f"of now); a node taken out for good: `pigeon cluster forget {node}`")  # fmt: skip
    if left_out.get("missing"):
        print(f"warning: {_names(left_out['missing'])} did not answer in time (down, or cut off from Redis), and "
              "not counted above: ask again once it is back")  # fmt: skip
    return left_out


def _left_out(answer: Any) -> dict[str, list[str]]:
    """The nodes a cluster's answer does not cover, by why: "pending" (a write: they apply it
    later), "missing" (a read: their part is not in it) and "unreached" (Redis could not be
    reached: every other node, whichever there are; `cluster.error` says what becomes of them)."""
    cluster = answer.get("cluster") if isinstance(answer, dict) else None
    left_out: dict[str, list[str]] = {}
    for node, state in sorted(((cluster or {}).get("nodes") or {}).items()):
        if state in ("pending", "missing"):
            left_out.setdefault(state, []).append(node)
    if isinstance(cluster, dict) and cluster.get("others_unreached"):
        left_out["unreached"] = ["the other nodes"]
    return left_out


def _names(nodes: list[str]) -> str:
    return ("node " if len(nodes) == 1 else "nodes ") + ", ".join(nodes)


def _complete(left_out: dict[str, list[str]]) -> int:
    """The exit status of an answer shown: 75 (`EX_TEMPFAIL`, as for a node whose workers did not
    all answer) if it leaves out a node of the cluster, so a script can tell; else 0."""
    return TEMPFAIL if left_out else 0


def _partly(args: argparse.Namespace, status: int, answer: Any) -> bool:
    """Whether a table is shown from a partial answer: what the workers that answered said."""
    return is_partial(status, answer) and "answers" in answer and not args.json


def _show_rules(args: argparse.Namespace, status: int, answer: Any) -> int:
    if (status >= 400 and not _partly(args, status, answer)) or args.json:
        return _show(args, status, answer, "")
    whole, answer = answer, printable(answer.get("answers", answer))  # reasons, selectors: as typed
    rules = answer["rules"]
    if not rules:
        print("none")
    cluster = answer.get("cluster") or {}
    held_by = cluster.get("held_by")
    answered = sorted(node for node, state in (cluster.get("nodes") or {}).items() if state == "done")
    # Ids made here are 12 characters; one a client gave through the API may be shorter or longer.
    id_width = max((len(rule["id"]) for rule in rules), default=0)
    for rule in rules:
        selector = " ".join(f"{k}={v}" for k, v in rule["selector"].items())
        # Without an end: a suspension lasts until `pigeon resume`, a standing bounce until `--cancel`.
        until = _when(rule["expires"]) if rule.get("expires") else _UNTIL_ENDED.get(rule.get("kind"), "until ended")
        reason = f": {rule['reason']}" if rule.get("reason") else ""  # no dangling colon without one
        via = f" via {rule['via']}" if rule.get("via") else ""
        # A cluster's list adds up the nodes' rules: say which nodes that answered do not hold one.
        lacking = [node for node in answered if node not in held_by.get(rule["id"], [])] if held_by else []
        # And a node's list adds up its workers' rules: which workers that answered do not hold one.
        lacking += [f"worker {index}" for index in answer.get("not_held", {}).get(rule["id"], [])]
        missing = f"  [not held on {', '.join(lacking)}]" if lacking else ""
        print(f"{rule['id']:{id_width}}  {selector:40} {until:25} by {rule.get('operator', '?')}{via}{reason}{missing}")
    left_out = _show_nodes(answer, args)
    return fail(status, whole) if status >= 400 else _complete(left_out)


_UNTIL_ENDED: Final = {"suspend": "until resumed", "bounce": "until cancelled"}


def _when(timestamp: float) -> str:
    try:
        return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, ValueError, OSError):
        # A rule stored before durations were bounded (10**30 s) must not crash every listing.
        return f"{timestamp:.4g} (Unix time, past the year 9999)"
