"""What a delivery attempt reports back to the queue: one reply per recipient, and where.

Delivery agents try and report; only the queue decides what a reply means for the message
(Postfix's division between `smtp` and `qmgr`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pigeon.smtp.replies import Reply


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt at a message: `replies[i]` is what happened to its recipient `i`."""

    replies: list[Reply]
    site: str = ""
    peer: str | None = None
    tls: str | None = None
    duration: float | None = None

    @classmethod
    def same_for_all(cls, reply: Reply, count: int, site: str = "", peer: str | None = None) -> Attempt:
        return cls([reply] * count, site, peer)
