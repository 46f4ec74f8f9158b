"""`pigeon top`: a live view of a running node: rates, queues, connections, and its inbound
mailboxes, refreshed in place."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import textwrap
import time
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from pigeon.cli.admin import NOT_A_CLUSTER, _left_out, cluster_path
from pigeon.cli.api import TEMPFAIL, ApiClient, add_api_options, fail, is_partial, printable

EXAMPLES = """examples:
  pigeon top                      # refresh every 2 seconds until Ctrl-C
  pigeon top --interval 5
  pigeon top --once               # one frame, for a script or a log
  pigeon top --once --json        # the same frame as one JSON document
  pigeon top --interval 60 >> top.log   # not a terminal: frames one after another, no escape codes

Exits 0 (Ctrl-C, or after --once); 3 if the node cannot be reached (its address and why are
printed: is `pigeon serve` running, is --url or [http] listen right?); 2 if it refuses the request;
75 if it cannot answer now (429, a 5xx).
A worker that does not answer (restarting) leaves its queues out: the frame names it.
"""
_RATES = (
    ("received", "pigeon_messages_received_total", None),
    ("delivered", "pigeon_recipients_total", "Delivery"),
    ("deferred", "pigeon_recipients_total", "TransientFailure"),
    ("bounced", "pigeon_recipients_total", "Bounce"),
    ("expired", "pigeon_recipients_total", "Expiration"),
    ("admin-bounced", "pigeon_recipients_total", "AdminBounce"),
)
_INBOUND_OUTCOMES = ("delivered", "deferred", "failed")
_SCHEDULED_ROWS = 15  # the biggest queues shown
_READY_ROWS = 10
_CLUSTER_COMMENT = "# pigeon cluster nodes:"  # the nodes /metrics?cluster=1 added up
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen: written only to a terminal
# Each frame asks every worker for its queues, metrics and health: 0 would ask without rest
# (and a negative one ended in a traceback); a day is already more than anyone watches.
MIN_INTERVAL: Final = 0.1
MAX_INTERVAL: Final = 86400.0


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "top",
        help="live view of queues, rates and connections",
        description="A live view of a running node: rates per second, scheduled and ready queues, connections. "
        "With --json, each frame is printed as JSON instead (--once: one document; else one a line).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_api_options(parser)
    parser.add_argument(
        "--interval",
        type=interval,
        default=2.0,
        help=f"seconds between refreshes, from {MIN_INTERVAL:g} to {MAX_INTERVAL:g} (default 2)",
    )
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument(
        "--cluster", action="store_true", help="the whole cluster (nodes sharing [redis]): queues and rates added up"
    )
    parser.set_defaults(run=run)


def interval(value: str) -> float:
    """An argparse type: --interval's seconds, within bounds (a usage error, exit 2, otherwise)."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not MIN_INTERVAL <= seconds <= MAX_INTERVAL:  # NaN too
        raise argparse.ArgumentTypeError(f"give from {MIN_INTERVAL:g} to {MAX_INTERVAL:g} seconds, not {value}")
    return seconds


def run(args: argparse.Namespace) -> int:
    client = ApiClient(args)
    live = sys.stdout.isatty()
    previous, _ = _counters(client, args.cluster)
    started = time.monotonic()
    try:
        while True:
            time.sleep(min(args.interval, 1.0) if args.once else args.interval)  # rates need an interval
            status, queues = client.request("GET", cluster_path(args, "/api/v1/queues"))
            answer = queues
            unavailable = None
            missing = None
            if is_partial(status, queues):  # a worker restarting: the others' queues, and which is missing
                missing = queues.get("missing", [])
                queues = queues.get("answers") or {"scheduled": [], "ready": []}
            elif status == 503:  # delivery is off (a node that only receives): no queues to show
                unavailable = str(queues.get("error", "503")) if isinstance(queues, dict) else str(queues)
                queues = {"scheduled": [], "ready": []}
            elif status != 200:
                return fail(status, queues)
            counters, nodes = _counters(client, args.cluster)
            elapsed = max(time.monotonic() - started, 1e-6)
            shown = _snapshot(client, queues, counters, previous, elapsed)
            if unavailable is not None:
                shown["queues"]["error"] = unavailable
            if missing is not None:
                shown["queues"]["missing"] = missing
            if args.cluster:
                shown["cluster"] = _cluster(queues, nodes, unavailable)
            if args.json:
                text = json.dumps(shown, indent=2 if args.once else None) + "\n"
            elif args.once:
                text = _screen(shown)
            elif live:  # a terminal: the frame replaces the last one
                text = CLEAR + _screen(shown)
            else:  # a pipe or a file: frames one after another, plain text a log or grep can read
                text = _screen(shown) + "\n"
            sys.stdout.write(text)
            sys.stdout.flush()
            if args.once:
                # As every read exits: 75 when its answer leaves out a worker or, asked of the
                # cluster, a node (Redis away: this node's alone), so that a script can tell.
                left_out = missing or (args.cluster and status == 200 and _left_out(answer))
                return TEMPFAIL if left_out else 0
            previous, started = counters, time.monotonic()
    except KeyboardInterrupt:
        return 0


def _cluster(queues: Any, nodes: dict[str, str] | None, unavailable: str | None) -> dict[str, Any]:
    """Which nodes the frame adds up, and why not all of them: the queues' answer says it, else
    the nodes /metrics added up; a node that could not answer for the queues says why."""
    if "cluster" in queues:
        return dict(queues["cluster"])
    if nodes is not None:  # the counters are the cluster's (the queues, missing, say why)
        return {"nodes": nodes}
    if unavailable is not None:  # asked of a node that does not answer for the cluster: why
        return {"nodes": {}, "error": f"this node only: {unavailable}"}
    return {"nodes": {}, "error": NOT_A_CLUSTER}


def _counters(client: ApiClient, cluster: bool = False) -> tuple[dict[str, float], dict[str, str] | None]:
    """The counters `top` shows, from /metrics (a `read` token bound to no tenant needed there with
    `[http] status_token_required`, and for the cluster's, added up), and the nodes they add up
    (None: this node's own)."""
    status, raw = client.fetch("/metrics" + ("?cluster=1" if cluster else ""), timeout=40)
    if status != 200:
        raise SystemExit(fail(status, _decoded(raw)))
    text = raw.decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("pigeon_messages_received_total", "pigeon_recipients_total"):
                found[f"{sample.name}/{sample.labels.get('outcome', '')}"] = sample.value
            elif sample.name in ("pigeon_spool_messages", "pigeon_smtp_connections"):
                found[sample.name] = sample.value
            elif sample.name == "pigeon_outbound_connections":
                found["outbound"] = found.get("outbound", 0) + sample.value
            elif sample.name == "pigeon_inbound_messages_total":
                key = f"inbound/{sample.labels['outcome']}"
                found[key] = found.get(key, 0) + sample.value
    nodes = None
    for line in text.splitlines():
        if line.startswith(_CLUSTER_COMMENT):
            pairs = (pair.partition("=") for pair in line.removeprefix(_CLUSTER_COMMENT).split())
            nodes = {node: state for node, _, state in pairs}
    return found, nodes


def _snapshot(
    client: ApiClient, queues: Any, now: dict[str, float], before: dict[str, float], seconds: float
) -> dict[str, Any]:
    """One frame's data: what the screen shows, and what --json prints."""

    def rate(key: str) -> float:
        return round((now.get(key, 0) - before.get(key, 0)) / seconds, 3)

    shown: dict[str, Any] = {
        "url": client.url,
        "time": round(time.time(), 3),
        "rates": {label: rate(f"{name}/{outcome or ''}") for label, name, outcome in _RATES},
        "spool_messages": int(now.get("pigeon_spool_messages", 0)),
        "smtp_connections": {"in": int(now.get("pigeon_smtp_connections", 0)), "out": int(now.get("outbound", 0))},
        "queues": {
            "scheduled": sorted(queues["scheduled"], key=lambda r: -r["messages"])[:_SCHEDULED_ROWS],
            "ready": sorted(queues["ready"], key=lambda r: -r["queued"])[:_READY_ROWS],
        },
    }
    mailboxes = _mailboxes(client)
    if mailboxes or any(key.startswith("inbound/") for key in now):
        shown["inbound"] = {
            "rates": {outcome: rate(f"inbound/{outcome}") for outcome in _INBOUND_OUTCOMES},
            "mailboxes": mailboxes,
        }
    return shown


def _mailboxes(client: ApiClient) -> dict[str, Any]:
    """Each mailbox's state, as /healthz says it."""
    # 503: something is down; the body says what (its components: to the token, with [http] status_token_required)
    _, answer = client.fetch("/healthz", timeout=10)
    decoded = _decoded(answer)
    mailboxes: dict[str, Any] = decoded.get("inbound", {}) if isinstance(decoded, dict) else {}
    return mailboxes


def _decoded(raw: bytes) -> Any:
    """A JSON answer, or its text as an error (a proxy's HTML page, say)."""
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": raw.decode(errors="replace").strip()}


def _screen(shown: dict[str, Any]) -> str:
    # Queue names, sites, a mailbox's error: anyone's words, escaped (only CLEAR is ours to send).
    shown = printable(shown)
    width = shutil.get_terminal_size((100, 30)).columns
    lines = [f"pigeon top  {shown['url']}  {time.strftime('%H:%M:%S', time.localtime(shown['time']))}"]
    lines.append("  ".join(f"{label} {value:,.0f}/s" for label, value in shown["rates"].items()))
    cluster = shown.get("cluster")
    if cluster:
        states = ", ".join(f"{node} {state}" for node, state in sorted(cluster.get("nodes", {}).items()))
        error = cluster.get("error")
        lines.append(f"cluster: {states}" + (f"  ({error})" if states and error else error or ""))
    smtp = shown["smtp_connections"]
    stored = shown["spool_messages"]
    lines.append(
        f"spool {stored:,} message{'' if stored == 1 else 's'}   smtp connections {smtp['in']} in, {smtp['out']} out"
    )
    queues = shown["queues"]
    # Sentences, not table rows: wrapped at a word (the rows are cut at the terminal's edge).
    if queues.get("error"):
        lines += ["", *textwrap.wrap(f"no queues: {queues['error']}", width, subsequent_indent="  ")]
    if queues.get("missing"):
        said = "; ".join(f"worker {m.get('worker')}: {m.get('error')}" for m in queues["missing"])
        note = f"queues of the other workers only, not every worker answered ({said})"
        lines += ["", *textwrap.wrap(note, width, subsequent_indent="  ")]
    lines.append("")
    # The columns of `pigeon queue summary`: "held" for an operator's retry, "suspended" by a suspension.
    lines.append(f"{'scheduled queue':44} {'messages':>9} {'due':>7} {'held':>6} {'suspended':>9} {'ready':>6} "
                 f"{'in flight':>9}")  # fmt: skip
    for row in queues["scheduled"]:
        lines.append(
            f"{row['queue'][:44]:44} {row['messages']:>9,} {row['due']:>7,} {row.get('held', 0):>6,} "
            f"{row.get('suspended', 0):>9,} {row.get('ready', 0):>6} {row.get('in_flight', 0):>9}"
        )
    lines.append("")
    lines.append(f"{'ready queue':52} {'queued':>8} {'connections':>11}  state")
    for row in queues["ready"]:
        lines.append(f"{row['path'][:52]:52} {row['queued']:>8,} {row['connections']:>11}  {_ready_state(row)}")
    inbound = shown.get("inbound")
    if inbound is not None:
        lines += ["", "inbound  " + "  ".join(f"{k} {v:,.0f}/s" for k, v in inbound["rates"].items())]
        mailboxes = inbound["mailboxes"]
        if mailboxes:
            lines.append(f"{'mailbox':24} {'target':16} {'state':10} {'last poll':>10} {'claims':>6}  error")
        for name, state in sorted(mailboxes.items()):
            polled = f"{time.time() - state['last_poll']:.0f}s ago" if state.get("last_poll") else "never"
            # The mailbox's own status, as /healthz says it: "down" only after `down_after` of
            # trouble (when the node answers 503); a reconnect in progress is "degraded".
            status = state.get("status") or ("ok" if state.get("connected") else "degraded")
            connected = ("connected" if state.get("connected") else "connecting") if status == "ok" else status
            lines.append(
                f"{name[:24]:24} {state.get('target', '')[:16]:16} {connected:10} {polled:>10} "
                f"{state.get('claims', 0):>6}  {state.get('error') or ''}"
            )
            note = state.get("note")
            if note and note.get("resolved_at") is None:
                # The last problem any node saw on the mailbox and still sees: why it is
                # unhealthy there, when this node's own view says nothing (or something else).
                lines.append(f"{'':24} note from {note.get('node')}, {time.time() - note.get('at', 0):.0f}s ago: "
                             f"{note.get('problem')}")  # fmt: skip
    return "\n".join(line[:width] for line in lines) + "\n"


def _ready_state(row: dict[str, Any]) -> str:
    """Why a ready queue's mail may not be moving: its site down, suspended, a reaction's effect."""
    states = ["site down"] if row.get("down") else []
    if row.get("suspended_by"):
        states.append("suspended")
    states += [str(effect.get("action", "effect")) for effect in row.get("effects", ())]
    return ", ".join(states) or "-"
