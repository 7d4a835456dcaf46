"""How much an acquire waits while someone reads long windows, on a real redis-server (issue 37).

A store for 20 routes holds an hour of latency slices for each. One task acquires and releases
a slot of one pool, one request at a time, and times each acquire; it does so first with
nothing else going on, then while another task reads all 20 routes' hour windows back to back
(what `/admin/report`, the canary controller and the economics gauges do). The figure is what
the reads add to an acquire: p50 and p99, reading minus quiet.

Each source tree runs in a child process of its own (`--before DIR` adds an earlier tree, e.g.
`git worktree add /tmp/before 858ce90`, where every command shared one Redis line), rounds
alternating between the trees, on one redis-server:

    python -m bench.acquire_latency [--acquires 2000] [--rounds 3] [--before DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

# a child imports these from the tree under test (its PYTHONPATH comes first)
from router.state.latency import Metric
from router.state.redis.store import RedisStore
from router.state.slots import Slots

ROUTES = [f"m/r{i:02d}" for i in range(20)]
WINDOW_S = 3600.0
HERE = Path(__file__).resolve()


# The child runs this file from another source tree, so it imports no bench module: these two
# helpers stand here beside bench/loadgen.py's free_port and pct rather than import them.
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _child(port: int, acquires: int) -> dict[str, float]:
    store = RedisStore(f"redis://127.0.0.1:{port}/0", ["p"], routes=ROUTES, prefix=uuid.uuid4().hex[:8])
    await store.start()
    try:
        now = time.time()
        for minute in range(60):  # an hour of slices, every route
            for route in ROUTES:
                store.series._book.observe(route, Metric.TTFT, 100.0 + minute, now - minute * 60)
        await store.series.flush()

        async def acquire_times() -> list[float]:
            times = []
            for _ in range(acquires):
                started = time.perf_counter()
                lease = await store.leases.try_acquire("p", Slots(8))
                times.append((time.perf_counter() - started) * 1000)
                assert lease is not None
                await store.leases.release(lease)
            return times

        quiet = await acquire_times()
        reads = 0
        stop = asyncio.Event()

        async def read_windows() -> None:
            nonlocal reads
            while not stop.is_set():
                await store.series.latency_window(ROUTES, Metric.TTFT, WINDOW_S)
                reads += 1

        reader = asyncio.get_running_loop().create_task(read_windows())
        started = time.perf_counter()
        reading = await acquire_times()
        elapsed = time.perf_counter() - started
        stop.set()
        await reader
    finally:
        await store.close()
    return {
        "quiet_p50": _quantile(quiet, 0.5),
        "quiet_p99": _quantile(quiet, 0.99),
        "reading_p50": _quantile(reading, 0.5),
        "reading_p99": _quantile(reading, 0.99),
        "reads_per_s": reads / elapsed,
    }


def _run_tree(tree: Path, port: int, acquires: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(HERE), "--child", str(port), "--acquires", str(acquires)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: the child failed:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--acquires", type=int, default=2000, help="acquires timed per phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, metavar="DIR", help="an earlier source tree, measured beside")
    parser.add_argument("--child", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(asyncio.run(_child(args.child, args.acquires))))
        return
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        raise SystemExit("redis-server not found: apt-get install -y redis-server")
    trees = {"this tree": HERE.parents[1]}
    if args.before is not None:
        if not (args.before / "router" / "state").is_dir():
            raise SystemExit(f"--before {args.before}: not a tidegate source tree (no router/state)")
        trees = {f"before ({args.before})": args.before.resolve(), **trees}
    port = _free_port()
    server = subprocess.Popen(
        [redis_server, "--port", str(port), "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL
    )
    try:
        _wait_for(port)
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for round_ in range(args.rounds):
            for name, tree in trees.items():
                rows[name].append(_run_tree(tree, port, args.acquires))
                print(f"  round {round_ + 1}/{args.rounds}: {name} done", file=sys.stderr)
        _print(rows, args)
    finally:
        server.terminate()
        server.wait(timeout=10)


def _wait_for(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"redis-server did not listen on {port}")


def _print(rows: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    print(f"acquire latency, ms ({args.acquires} acquires a phase, {len(ROUTES)} routes' 1 h windows read)")
    print(f"{'tree':44} {'quiet p50':>9} {'p99':>7} {'reading p50':>11} {'p99':>7} {'added p50':>9} {'p99':>7} {'reads/s':>8}")
    for name, runs in rows.items():
        for run in runs:
            added50 = run["reading_p50"] - run["quiet_p50"]
            added99 = run["reading_p99"] - run["quiet_p99"]
            print(
                f"{name:44} {run['quiet_p50']:9.3f} {run['quiet_p99']:7.3f} {run['reading_p50']:11.3f} "
                f"{run['reading_p99']:7.3f} {added50:9.3f} {added99:7.3f} {run['reads_per_s']:8.1f}"
            )
        median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"{name + ' (median)':44} {'':9} {'':7} {'':11} {'':7} "
            f"{median['reading_p50'] - median['quiet_p50']:9.3f} {median['reading_p99'] - median['quiet_p99']:7.3f}"
        )


if __name__ == "__main__":
    main()
