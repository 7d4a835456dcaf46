"""Cancel work when the HTTP client goes away: a non-stream answer nobody waits for should not
keep an upstream busy (or, in the simulator, a GPU slot)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.types import Receive

T = TypeVar("T")


async def unless_client_leaves(receive: Receive, work: Coroutine[Any, Any, T]) -> T | None:
    """Run `work` in this task, cancelling it if the client disconnects first (None then).
    Call it once the request body has been read: the next ASGI message can then only be the
    disconnect. Exceptions from `work` pass through unchanged.

    One watcher task per call. If the disconnect and the end of `work` race, either `work`
    finished first (the watcher then sees `finished` and does nothing) or the cancellation
    lands inside `work`, which handles it like any cancellation (releases, records)."""
    host = asyncio.current_task()
    assert host is not None
    finished = False
    fired = False

    async def watch() -> None:
        nonlocal fired
        while (await receive())["type"] != "http.disconnect":
            pass
        if not finished:
            fired = True
            host.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not fired:
            raise
        host.uncancel()
        return None
    finally:
        finished = True
        watcher.cancel()
