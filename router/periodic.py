"""Background work that repeats, supervised: one loop for every store refresh, flush and tick.

A loop's step may fail two ways. An *outage* (an exception of its `survives` classes: the store
unreachable) is expected: it is logged as a warning and the loop goes on at its interval. Any
other exception is a fault: it is logged with the loop's name and its traceback, and the loop
goes on after a backoff (its interval, doubled per fault in a row, at most `MAX_BACKOFF_S`); it
never ends silently. A turn that returns, or fails with an outage, *completes*.

`Loops` keeps each loop's last completion: a loop that has not completed for `STALE_INTERVALS`
of its intervals (at least `STALE_FLOOR_S`) is *stale*, and a stale loop makes `/readyz` not
ready (router/http/routes.py), since the replica's shared state is then frozen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("tidegate")

MAX_BACKOFF_S = 30.0
STALE_INTERVALS = 10
STALE_FLOOR_S = 15.0


@dataclass(slots=True)
class Heartbeat:
    """One loop's health: when it last completed a turn (monotonic seconds), its faults in a row."""

    name: str
    interval_s: float
    completed_at: float
    faults: int = 0

    def stale(self, now: float) -> bool:
        return now - self.completed_at > max(STALE_INTERVALS * self.interval_s, STALE_FLOOR_S)


class Loops:
    """The heartbeats of one process's background loops (the app shares one `Loops` among its
    parts; a part built alone makes its own)."""

    def __init__(self) -> None:
        self._beats: dict[str, Heartbeat] = {}

    def every(
        self,
        name: str,
        interval_s: float,
        step: Callable[[], Awaitable[None]],
        stop: asyncio.Event | None = None,
        *,
        survives: tuple[type[Exception], ...] = (),
    ) -> Coroutine[Any, Any, None]:
        """`every(...)` with its heartbeat kept here under `name`."""
        beat = Heartbeat(name, interval_s, time.monotonic())
        self._beats[name] = beat
        return every(interval_s, step, stop, survives=survives, name=name, heartbeat=beat)

    def stale(self, now: float | None = None) -> list[str]:
        """The names of the loops that have not completed a turn for too long."""
        at = time.monotonic() if now is None else now
        return sorted(b.name for b in self._beats.values() if b.stale(at))


async def every(
    interval_s: float,
    step: Callable[[], Awaitable[None]],
    stop: asyncio.Event | None = None,
    *,
    survives: tuple[type[Exception], ...] = (),
    name: str | None = None,
    heartbeat: Heartbeat | None = None,
) -> None:
    """Run `step`, then wait `interval_s` (after a fault, its backoff), until `stop` is set or
    the task is cancelled. `stop` is checked on every turn because a client library may turn a
    cancellation into an error of its own."""
    stop = stop or asyncio.Event()
    label = name or getattr(step, "__name__", repr(step))
    faults = 0
    while not stop.is_set():
        wait = interval_s
        try:
            await step()
        except survives as exc:
            log.warning("background %s failed: %s", label, exc)
            faults = 0
        except Exception:
            if stop.is_set():
                return
            faults += 1
            wait = min(MAX_BACKOFF_S, interval_s * 2.0**faults)
            log.exception("background %s failed (%d in a row); again in %gs", label, faults, wait)
        else:
            faults = 0
        if heartbeat is not None:
            heartbeat.faults = faults
            if faults == 0:
                heartbeat.completed_at = time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)


async def stop(task: asyncio.Task[None] | None, stop_event: asyncio.Event) -> None:
    """End a loop started with `every` (or any task): signal it, cancel it, wait for it."""
    stop_event.set()
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
