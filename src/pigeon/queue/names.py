"""Queue names.

Scheduled queue: `campaign:tenant@domain` (KumoMTA's convention, so its users find their
way): missing parts are left out, giving `tenant@domain`, `campaign:@domain` or `domain`.

Ready queue: `source->site`, shared by every domain whose MX hosts are the site's, or
`source->domain@site` for a domain a `[[shaping]]` block (other than `domain = "*"`) gives a
queue of its own; either may end in the TLS policy (`Destination.security`).
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


def ready_queue(source: str, site: str, domain: str | None = None, security: str = "") -> str:
    """The ready queue of mail from `source` to `site`; `domain`: that domain's own queue."""
    return f"{source}->{domain}@{site}{security}" if domain else f"{source}->{site}{security}"
