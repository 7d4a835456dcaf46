"""Cancel work when the HTTP client goes away: a non-stream answer nobody waits for should not
keep an upstream busy (or, in the simulator, a GPU slot)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.types import Receive

T = TypeVar("T")


async def unless_client_leaves(receive: Receive, work: Coroutine[Any, Any, T]) -> T | None:
    """Run `work`, cancelling it if the client disconnects first (None then). Call it once the
    request body has been read: the next ASGI message can then only be the disconnect.
    Exceptions from `work` pass through unchanged; if the caller is cancelled, so is `work`."""

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    job = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((job, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not job.done():
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)
    return None if job.cancelled() else job.result()
