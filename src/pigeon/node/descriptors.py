"""Open files shared out between a process's listeners, so that none can take them all.

Every connection is an open file (a descriptor), and so are the spool's database, segments and
large bodies, the log segments and delivery's connections. A process out of them (EMFILE) fails
whatever opens one next: an SMTP client is left unanswered, a body's file cannot be written
(451), a delivery cannot connect, `/healthz` goes unanswered. `pigeon serve` raises its soft
limit to the hard one; where even that is below what the listeners of a process may hold
(`[smtp] max_connections` and `[http] max_connections`) with `RESERVED` left for the rest,
the process keeps its listeners to less, and says so at start: HTTP to an eighth of what is
left at most (its connections need no more, and cost nothing to open), SMTP to the rest, so
that neither idle HTTP clients nor a crowd of SMTP ones can leave the spool without files.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Final

RESERVED: Final = 256
"""Descriptors left for everything but the listeners' connections: the spool, the logs,
delivery's connections, the policy module's, the libraries'."""
_LEAST: Final = 16  # a listener's cap is never held below this, however low the limit
_HTTP_PART: Final = 8  # HTTP's share of what is left, at most, when it shares with SMTP


@dataclass(frozen=True, slots=True)
class Shares:
    """The connections each listener of a process keeps to, and why, when below its setting."""

    smtp: int
    http: int
    warning: str | None = None


def open_files_limit() -> int:
    """This process's soft RLIMIT_NOFILE (unlimited as a very large number)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 30 if soft == resource.RLIM_INFINITY else soft


def share(limit: int, smtp: int, http: int) -> Shares:
    """The caps of a process whose open files limit is `limit`, with `smtp` and `http` the
    configured ones of the listeners it serves (0: it serves none of that kind)."""
    room = max(limit - RESERVED, 0)
    if smtp + http <= room:
        return Shares(smtp, http)
    if smtp == 0:
        held_http, held_smtp = min(http, max(_LEAST, room)), 0
    else:
        held_http = min(http, max(_LEAST, room // _HTTP_PART))
        held_smtp = min(smtp, max(_LEAST, room - held_http))
    wanted = " + ".join(
        f"[{name}] max_connections ({count})" for name, count in (("smtp", smtp), ("http", http)) if count
    )
    kept = " and ".join(f"{count} {name}" for name, count in (("SMTP", held_smtp), ("HTTP", held_http)) if count)
    warning = (
        f"open files: the limit (RLIMIT_NOFILE) is {limit}, below {wanted} with {RESERVED} left for its "
        f"other files (spool, logs, deliveries): this process keeps to {kept} connections, so that none can "
        f"leave the others without files; raise the hard limit (systemd: LimitNOFILE=) or lower max_connections"
    )
    return Shares(held_smtp, held_http, warning)
