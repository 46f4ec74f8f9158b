"""Policy hooks: plain Python functions, in a module of the user's, that Pigeon calls at
defined points (`[policy] module`). Not to be confused with `pigeon.queue.policy`, the
retry settings of scheduled queues.

What a policy module imports from here:

    from pigeon.policy import Changes, Refuse

* `objects`: what each hook is given (frozen dataclasses: `Connection`, `MailFrom`, `RcptTo`,
  `ReceivedMessage`, `Delivery`, `DeliveryOutcome`);
* `answers`: what it may return (`Refuse`, `Changes`, `Defer`, `Fail`, `Reroute`, `Reclassify`);
* `hooks`: loading the module and calling its hooks (Pigeon's side);
* `delivery`: what the delivery hooks' answers do to an attempt (Pigeon's side).

The README's "Policy hooks" documents each hook with an example.
"""

from pigeon.policy.answers import Changes, Defer, Fail, Reclassify, Refuse, Reroute
from pigeon.policy.objects import (
    Connection,
    Delivery,
    DeliveryOutcome,
    Headers,
    MailFrom,
    RcptTo,
    ReceivedMessage,
    RecipientResult,
)

__all__ = [
    "Changes",
    "Connection",
    "Defer",
    "Delivery",
    "DeliveryOutcome",
    "Fail",
    "Headers",
    "MailFrom",
    "RcptTo",
    "ReceivedMessage",
    "RecipientResult",
    "Reclassify",
    "Refuse",
    "Reroute",
]
