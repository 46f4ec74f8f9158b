"""Queue names.

Scheduled queue: `campaign:tenant@domain` (KumoMTA's convention, so its users find their
way): missing parts are left out, giving `tenant@domain`, `campaign:@domain` or `domain`.
"""

from __future__ import annotations


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
