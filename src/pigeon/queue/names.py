"""Queue names.

Scheduled queue: `campaign:tenant@domain` (KumoMTA's convention, so its users find their
way): missing parts are left out, giving `tenant@domain`, `campaign:@domain` or `domain`.

Ready queue: `source->site`, shared by every domain whose MX hosts are the site's, or
`source->domain@site` for a domain a `[[shaping]]` block (other than `domain = "*"`) gives a
queue of its own; either may end in the TLS policy (`Destination.security`).

A policy hook may name a queue outright, and an `[[inbound]]` route's mail is in
`inbound:<target>`.

A name an operator gives (`pigeon rebind --to-queue`) must be one queue, typed whole:
`QUEUE_NAME_TEXT` says what that is, and the README and the OpenAPI document quote it.
"""

from __future__ import annotations

import re
from typing import Final

MAX_QUEUE_NAME: Final = 255
"""Longest queue name an operator or a policy may give: it is written into every log record,
metric label and spool row of its messages."""
QUEUE_NAME_TEXT: Final = (
    f"1 to {MAX_QUEUE_NAME} characters, without white space, control characters or the glob characters * and ?"
)
# Globs are refused because a name given where one queue is meant (a rebind's destination)
# that holds `*` is almost surely a selector typed in the wrong place, not a queue.
QUEUE_NAME: Final = re.compile(rf"[^\s\x00-\x1f\x7f-\x9f*?]{{1,{MAX_QUEUE_NAME}}}")


def scheduled_queue(domain: str, tenant: str | None = None, campaign: str | None = None) -> str:
    """The scheduled queue of a message for `domain`."""
    name = domain.lower()
    if tenant:
        name = f"{tenant}@{name}"
    elif campaign:
        name = f"@{name}"
    if campaign:
        name = f"{campaign}:{name}"
    return name


def ready_queue(source: str, site: str, domain: str | None = None, security: str = "") -> str:
    """The ready queue of mail from `source` to `site`; `domain`: that domain's own queue."""
    return f"{source}->{domain}@{site}{security}" if domain else f"{source}->{site}{security}"


def queue_name_problem(name: str) -> str | None:
    """Why `name` is not a queue name an operator may give (None: it is one)."""
    if QUEUE_NAME.fullmatch(name):
        return None
    if not name:
        return "a queue name is not empty"
    if len(name) > MAX_QUEUE_NAME:
        return f"a queue name is at most {MAX_QUEUE_NAME} characters, not {len(name)}"
    if "*" in name or "?" in name:
        return f"{name[:60]!r} is a glob: name the one queue to move the mail to (globs select, with queue)"
    return f"{name[:60]!r} is not a queue name: {QUEUE_NAME_TEXT}"


_INBOUND_PREFIX: Final = "inbound:"  # the queues of [[inbound]] routes' mail (inbound/routes.py)
_READY_SEPARATOR: Final = "->"  # ready queues are source->site: a scheduled queue never looks like one


def hook_queue_name_problem(name: object) -> str | None:
    """Why `name` cannot be a scheduled queue name a policy hook gives (`Changes(queue=...)`),
    or None when it can: a string of 1 to 255 printable characters without white space, not
    in the `inbound:` namespace of `[[inbound]]` routes, without the `->` of ready queues."""
    if not isinstance(name, str):
        return f"a queue name is a string, not {type(name).__name__}"
    if not name:
        return "a queue name cannot be empty"
    if len(name) > MAX_QUEUE_NAME:
        return f"a queue name is at most {MAX_QUEUE_NAME} characters, not {len(name)}"
    if not name.isprintable() or any(char.isspace() for char in name):
        return "a queue name holds no white space, control characters or NUL"
    if name.lower().startswith(_INBOUND_PREFIX):
        return f"queue names starting {_INBOUND_PREFIX!r} are the [[inbound]] routes' own"
    if _READY_SEPARATOR in name:
        return f"a queue name holds no {_READY_SEPARATOR!r} (ready queues are source->site)"
    return None
