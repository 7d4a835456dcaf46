"""The garbage collector, set for a long-running server (issue 13).

A full collection walks every object the collector tracks. After tidegate's imports (FastAPI,
pydantic, httpx, redis, OpenTelemetry, ...) that is about 200,000 objects and 130 ms on a
2-core VM: a pause of the whole event loop that landed on the p99 of every request in flight,
five times in ten seconds of load. What exists when serving starts lives as long as the
process, so it is frozen out of the collector's sight. And the youngest generation is
collected every 50,000 new container objects rather than every 700: a request's objects die
young either way (most by reference counting, with no collection at all), and far fewer
collections cost far less in all.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000  # new tracked objects between two collections of the youngest generation


def settle() -> None:
    """Collect once, freeze what is left, and space the young collections out. Call once,
    after the apps are built and before serving."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
