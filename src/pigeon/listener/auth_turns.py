"""Where an AUTH waits for other password checks to be counted before its own may begin.

`AuthLimits.begin` answers `InFlight` when failures and checks in progress together reach a
limit: the check must not begin yet (each one in progress may fail, and the allowance would be
overshot), but it is no lockout either. The listener then waits for a turn: `AuthTurns.turn`
is done when a check of this worker has been counted (`counted`), which may have freed a
place, or after a short while at the latest, since a check that ends on another worker of the
node is not signalled here and is seen only by asking again.
"""

from __future__ import annotations

import asyncio


class AuthTurns:
    """One worker's signal that a password check has been counted, for the AUTHs waiting."""

    def __init__(self) -> None:
        self._counted: asyncio.Future[None] | None = None
        self.waiting = 0
        """Turns not yet done."""

    def turn(self, when: float) -> asyncio.Future[None]:
        """Done at the next `counted`, or at `when` (loop time), whichever comes first. Nothing
        of it is left behind once done: a waiter that gave up costs nothing."""
        loop = asyncio.get_running_loop()
        counted = self._counted
        if counted is None or counted.done():
            counted = self._counted = loop.create_future()
        turn: asyncio.Future[None] = loop.create_future()

        def come(_: object = None) -> None:
            if not turn.done():
                turn.set_result(None)

        timer = loop.call_at(when, come)
        counted.add_done_callback(come)

        def done(_: object) -> None:
            timer.cancel()
            counted.remove_done_callback(come)
            self.waiting -= 1

        turn.add_done_callback(done)
        self.waiting += 1
        return turn

    def counted(self) -> None:
        """A password check has been counted (or abandoned): every AUTH waiting asks again."""
        counted, self._counted = self._counted, None
        if counted is not None and not counted.done():
            counted.set_result(None)
