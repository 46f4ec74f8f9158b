"""`pigeon cluster nodes` and `pigeon cluster forget NODE`: the nodes sharing the node's Redis.

`nodes` lists every node the cluster knows (GET /api/v1/cluster/nodes): those running, and
those stopped within a day, which admin writes name `pending` until they start again or are
forgotten. `forget` removes one that is not running (DELETE /api/v1/cluster/nodes/{node}): a
node decommissioned is then no longer named, and the writes exit 0 again.
"""

from __future__ import annotations

import argparse
import datetime
import json
import urllib.parse
from typing import Any, Final

from pigeon.cli.api import ApiClient, add_api_options, fail, printable

EXAMPLES: Final = """examples:
  pigeon cluster nodes                 # every node known: running, or stopped (and until when it is named)
  pigeon cluster forget mx3            # mx3 is decommissioned (stopped): writes no longer name it pending

A node stopped stays known for a day (admin writes name it `pending`, and exit 75, as it may
hold mail a write concerns); forget one taken out for good. One that runs is not forgotten:
stop it first. Started again later, a node is known again.
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "cluster",
        help="the nodes sharing [redis]: `pigeon cluster nodes`, `forget NODE`",
        description="The nodes of the cluster (nodes sharing [redis] url).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    nodes = actions.add_parser(
        "nodes",
        help="the nodes the cluster knows, running or not, and when each was last there",
        description="List the nodes the cluster knows: running, or stopped within a day.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_api_options(nodes)
    nodes.set_defaults(run=_nodes)
    forget = actions.add_parser(
        "forget",
        help="forget a node that is not running (decommissioned): admin writes no longer name it pending",
        description="Remove a node that is not running from the nodes the cluster knows.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    forget.add_argument("node", metavar="NODE", type=_node_name, help="its [node] name (`pigeon cluster nodes`)")
    add_api_options(forget)
    forget.set_defaults(run=_forget)


def _node_name(text: str) -> str:
    """A node's name as `[node] name` allows one (not empty, no white space or control
    characters), or a usage error before any request: found from outside, `forget ''` asked
    for /api/v1/cluster/nodes/ and answered `404: no endpoint at ...`, which named no mistake."""
    if not text:
        raise argparse.ArgumentTypeError("a node's name is needed, not '' (`pigeon cluster nodes` lists them)")
    if any(c.isspace() or not c.isprintable() for c in text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is no node's name: a [node] name has no white space or control characters "
            "(`pigeon cluster nodes` lists them)"
        )
    return text


def _nodes(args: argparse.Namespace) -> int:
    status, answer = ApiClient(args).request("GET", "/api/v1/cluster/nodes")
    if status != 200:
        return fail(status, answer)
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    answer = printable(answer)
    rows = answer.get("nodes") or []
    width = max([len("NODE"), *(len(row["node"]) for row in rows)])  # (the heading too: one-letter names)
    print(f"{'NODE':{width}}  {'STATE':12} {'WORKERS':>7}  {'LAST SEEN':23}  NOTE")
    for row in rows:
        this = " (the node asked)" if row["node"] == answer.get("node") and row["running"] else ""
        if row["running"]:
            state, note = "running", f"spool id {row.get('spool')}{this}"
        else:
            state = "stopped" if row.get("left") else "gone"
            how = "stopped gracefully" if row.get("left") else "its presence ran out: killed, or cut off from Redis"
            note = (
                f"{how}; named pending by admin writes until {_when(row['forgotten_at'])}, "
                f"or `pigeon cluster forget {row['node']}`"
            )
        print(f"{row['node']:{width}}  {state:12} {row.get('workers', '?'):>7}  {_when(row['last_seen']):23}  {note}")
    return 0


def _forget(args: argparse.Namespace) -> int:
    path = "/api/v1/cluster/nodes/" + urllib.parse.quote(args.node, safe="")
    status, answer = ApiClient(args).request("DELETE", path)
    if status != 200:
        return fail(status, answer)
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    for row in printable(answer).get("forgotten", []):
        print(
            f"forgot node {row['node']} (spool id {row.get('spool')}, last there at {_when(row['last_seen'])}): "
            "admin writes no longer name it; started again, it is known again"
        )
    return 0


def _when(timestamp: float) -> str:
    try:
        return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, ValueError, OSError):
        return f"{timestamp:.4g}"
