"""Errors of the sans-IO SMTP layer, each saying who is to blame.

* `SmtpProtocolError`: the peer broke the protocol. It carries the reply to send and whether
  the connection must close (for instance when BDAT framing is lost).
* `SmtpUsageError`: the application called the session wrongly (answered twice, read events
  before answering a decision). It is a bug in Pigeon, never the peer's doing.
"""

from __future__ import annotations

from pigeon.smtp.replies import Reply


class SmtpProtocolError(Exception):
    """The peer broke the protocol. `reply` is our answer, `close` says whether we hang up."""

    def __init__(self, reply: Reply, *, close: bool = False) -> None:
        super().__init__(str(reply))
        self.reply = reply
        self.close = close


class SmtpUsageError(Exception):
    """The application used the session out of order."""
