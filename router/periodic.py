"""Background work that repeats: one loop for every store refresh, flush and signal tick."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("tidegate")


async def every(
    interval_s: float,
    step: Callable[[], Awaitable[None]],
    stop: asyncio.Event | None = None,
    *,
    survives: tuple[type[Exception], ...] = (),
) -> None:
    """Run `step`, then wait `interval_s`, until `stop` is set (or the task is cancelled).
    An exception of a `survives` class is logged and the loop goes on; any other ends it.
    `stop` is checked on every turn because a client library may turn a cancellation into
    an error of its own."""
    stop = stop or asyncio.Event()
    while not stop.is_set():
        try:
            await step()
        except survives as exc:
            log.warning("background %s failed: %s", getattr(step, "__name__", step), exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)


async def stop(task: asyncio.Task[None] | None, stop_event: asyncio.Event) -> None:
    """End a loop started with `every` (or any task): signal it, cancel it, wait for it."""
    stop_event.set()
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
