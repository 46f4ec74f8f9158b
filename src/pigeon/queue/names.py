"""Queue names.

Scheduled queue: `campaign:tenant@domain` (KumoMTA's convention, so its users find their
way): missing parts are left out, giving `tenant@domain`, `campaign:@domain` or `domain`.
"""

from __future__ import annotations

from typing import Final


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


MAX_QUEUE_NAME: Final = 255
"""Longest scheduled queue name a policy may give: it is written into every log record, metric
label and spool row of its messages."""
_INBOUND_PREFIX: Final = "inbound:"  # the queues of [[inbound]] routes' mail (inbound/routes.py)
_READY_SEPARATOR: Final = "->"  # ready queues are source->site: a scheduled queue never looks like one


def queue_name_problem(name: object) -> str | None:
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
