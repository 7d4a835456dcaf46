"""How long the economics report takes over a long window, on a real redis-server.

Records `--requests` requests (default 100k) spread over the last `--hours` (default 24) into a
Redis store exactly as the gateway does (the same counters and histograms, flushed into the
same 10 s slices and 1 min / 1 h rollups), then times `GET /admin/report`'s computation over
that window, `--repeat` times. The report reads a fixed number of slices per route whatever the
traffic, so the figure should not grow with `--requests`.

    python -m bench.report [--requests 100000] [--hours 24] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench.loadgen import free_port
from policies.types import Snapshot, route_key
from router.config import parse_config
from router.economics.report import economics_report
from router.state.latency import Metric
from router.state.redis.store import RedisStore

CONFIG = """
auth: {allow_anonymous: true}
state: {redis_url: "redis://127.0.0.1:%d/0"}
models:
  m:
    dedicated: [{name: ded, base_url: "http://d/v1", model: d, max_concurrency: 16, gpus: 8, gpu_hour_usd: 4.41}]
    serverless:
      - {name: sl1, base_url: "http://s1/v1", model: s, usd_per_mtok_in: 0.55, usd_per_mtok_out: 2.19}
      - {name: sl2, base_url: "http://s2/v1", model: s, usd_per_mtok_in: 0.6, usd_per_mtok_out: 2.4}
"""


async def fill(store: RedisStore, requests: int, hours: float) -> None:
    """`requests` requests' records at random times over the last `hours`, flushed in batches."""
    rng = random.Random(1)
    now = time.time()
    routes = [route_key("m", name) for name in ("ded", "sl1", "sl2")]
    walls = sorted(now - rng.random() * hours * 3600 for _ in range(requests))
    for done, wall in enumerate(walls):  # in time order, flushed often: as a gateway would
        route = rng.choice(routes)
        busy = rng.lognormvariate(6, 0.8)
        counts = {"requests": 1, "ok": 1, "tasks": 1, "tasks_ok": 1, "busy_ms": busy, "reason:baseline": 1}
        counts |= {
            "tokens_in": rng.randint(100, 3000),
            "tokens_out": rng.randint(10, 800),
            "cost_usd": 0.0004,
        }
        store.series._counts.add(route, counts, wall)  # as series.count() does, at a chosen time
        store.series._book.observe(route, Metric.TTFT, rng.lognormvariate(5, 1), wall)
        store.series._book.observe(route, Metric.E2E, busy, wall)
        if done % 1000 == 999:
            await store.series.flush()
        if done % 20_000 == 19_999:
            print(f"  recorded {done + 1} requests", file=sys.stderr)
    await store.series.flush()


async def measure(port: int, args: argparse.Namespace) -> None:
    await asyncio.sleep(0.3)  # redis-server starting
    config = parse_config(CONFIG % port, {})
    store = RedisStore(config.state.redis_url, ["ded"], routes=config.route_keys())
    started = time.perf_counter()
    await fill(store, args.requests, args.hours)
    print(f"recorded {args.requests} requests over {args.hours:g} h in {time.perf_counter() - started:.1f} s")
    times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        found = await economics_report(config, store, Snapshot(now=time.monotonic()), args.hours * 3600)
        times.append(time.perf_counter() - started)
    print(
        f"report over {args.hours:g} h ({found['models']['m']['requests']} requests in it): "
        f"median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms over {args.repeat} runs"
    )
    await store.close()


def main(args: argparse.Namespace) -> None:
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server not found: apt-get install -y redis-server")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        redis = subprocess.Popen(
            [server, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL,
        )
        try:
            asyncio.run(measure(port, args))
        finally:
            redis.terminate()
            redis.wait(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--repeat", type=int, default=5)
    main(parser.parse_args())
