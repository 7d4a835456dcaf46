"""What the stream benchmarks share: the time to the first content event of a chat stream, as
its client sees it, and a nearest-rank percentile."""

from __future__ import annotations

import time
from typing import Any

import httpx


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


async def first_token_s(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[float | None, httpx.Response | None]:
    """Seconds from sending a chat stream to its first content event (None: no answer), and the
    response (its headers say where it went)."""
    started = time.monotonic()
    try:
        async with client.stream(
            "POST", url + "/chat/completions", json=body, headers=headers or {}
        ) as response:
            first = None
            async for line in response.aiter_lines():
                if first is None and line.startswith("data: {") and '"content":"' in line:
                    first = time.monotonic() - started
            return (first if response.status_code == 200 else None), response
    except httpx.HTTPError:
        return None, None
