"""A Redis store that cannot be reached says so with StoreUnavailable on the reads the gateway's
background loops make, and nothing else: those loops (the economics gauges on /metrics among
them) survive StoreUnavailable alone, so any other error would end them."""

from __future__ import annotations

import pytest

from router.config import parse_config
from router.economics.costs import dedicated_gauges
from router.errors import StoreUnavailable
from router.state.redis.store import RedisStore

CONFIG = (
    "auth: {allow_anonymous: true}\n"
    "models:\n  m:\n"
    "    dedicated: [{name: d, base_url: 'http://127.0.0.1:1/v1', model: x, gpu_hour_usd: 1, max_concurrency: 2}]\n"
)


async def test_count_windows_of_an_unreachable_redis_raise_store_unavailable():
    dead = RedisStore("redis://127.0.0.1:9/0", ["d"], routes=["m/ded/d"])  # nothing listens there
    try:
        with pytest.raises(StoreUnavailable):
            await dead.series.counts_window(["m/ded/d"], 60.0)
        with pytest.raises(StoreUnavailable):  # what the economics gauges' loop runs
            await dedicated_gauges(parse_config(CONFIG, {}), dead.series, 300.0)
    finally:
        await dead.close()


async def test_the_same_reads_answer_once_redis_is_there(redis_url):
    alive = RedisStore(redis_url, ["d"], routes=["m/ded/d"])
    try:
        counts = await alive.series.counts_window(["m/ded/d"], 60.0)
        assert counts == {"m/ded/d": {}}  # nothing counted yet, and no error
        gauges = await dedicated_gauges(parse_config(CONFIG, {}), alive.series, 300.0)
        assert gauges["d"]["utilization"] == 0.0
    finally:
        await alive.close()
