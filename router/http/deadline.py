"""One connection's deadline (its head's, its body's, a discard's) on one event-loop timer.

Each request arms a deadline twice (its head, its body) and disarms it twice. Making and
cancelling a loop timer each time was about 15k of the connection layer's 85k instructions per
request (bench.instructions, timers removed against kept), so arming only moves the deadline,
and the one loop timer, when it fires, runs what is due or waits again for what is not. A new
loop timer is made only for a deadline earlier than the one the loop already has.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Deadline:
    __slots__ = ("_at", "_loop", "_then", "_timer", "_timer_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None  # the loop's timer: fires at _timer_at
        self._timer_at = 0.0
        self._at: float | None = None  # when `_then` runs (None: nothing is timed)
        self._then: Callable[[], None] | None = None

    def arm(self, seconds: float, then: Callable[[], None]) -> None:
        """Run `then` `seconds` from now, unless disarmed or armed again first."""
        at = self._loop.time() + seconds
        self._at, self._then = at, then
        if self._timer is None or self._timer_at > at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._timer_at = self._loop.call_at(at, self._fired), at

    def disarm(self) -> None:
        self._at = self._then = None  # the loop's timer, when it fires, finds nothing due

    def stop(self) -> None:
        """Disarm and give the loop its timer back (the connection is gone)."""
        self.disarm()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fired(self) -> None:
        self._timer = None
        at, then = self._at, self._then
        if at is None or then is None:
            return
        if self._loop.time() >= at:
            self.disarm()
            then()
        else:
            self._timer, self._timer_at = self._loop.call_at(at, self._fired), at
