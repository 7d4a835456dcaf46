"""Gateway overhead: the same load sent straight to an upstream and through tidegate.

The upstream is nginx (bench/nginx_upstream.py), so the gateway is the bottleneck. Each
gateway variant runs as `tidegate serve` pinned to CPU 0; the load generator (aiohttp), nginx
and redis-server are pinned to CPU 1. Gateway CPU per request is the utime+stime (/proc) of
the gateway process and its workers.

Variants, measured one after the other against the same upstream in one run:
  floor       bench/floor.py: a bare passthrough on the same stack (uvicorn, Starlette,
              httpx over aiohttp), no routing, state, telemetry or logging
  memory      one worker, the embedded store
  redis       one worker, the Redis store on our own line (slot acquire + release per request)
  redis-2w    `--workers 2`, the Redis store (both workers on CPU 0)
  redis-norec one worker, the Redis store with `state.record: false` (no latency histograms
              or counters): the cost of recording, side by side with `redis`
  redis-py, glide, coredis
              the Redis store with a maintained client in place of our line
              (bench/redis_clients.py; `--clients` adds all three)
  cluster     one worker, the Redis store on a 3-master Redis Cluster (redis-py's cluster
              client; tests/servers.py starts the nodes; `--clients` adds it too)
  memory@before, redis@before
              memory and redis from an earlier source tree (`--before DIR`, e.g. a
              `git worktree add /tmp/before 509f476`), run with the same interpreter

    python -m bench.overhead [--seconds 5] [--rounds 1] [--concurrency 1 16 64]
                             [--variants floor memory redis redis-2w] [--clients] [--before DIR]

Prints one row per (path, concurrency, variant): requests/s, latency p50/p99, TTFT p50/p99
(first body byte), gateway CPU ms per request, and the gateway's added p50 and p99 TTFT over
the direct run of the same row; then every tidegate row against the floor's with issue 13's
targets, and (with `--before` or `--clients`) the rows compared pairwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench import overhead_summary as summaries
from bench.loadgen import Run, cpu_seconds, free_port, load, pct, pooled, wait_for
from bench.nginx_upstream import start_nginx
from bench.overhead_summary import Row, Rows
from bench.redis_clients import missing
from tests.servers import RedisClusterServers

GATEWAY_CONF = """
listen: {{host: 127.0.0.1, port: {port}}}
auth: {{allow_anonymous: true}}
state: {{redis_url: "{redis_url}", record: {record}}}
models:
  plain:
    dedicated: [{{name: nginx-plain, gpu_hour_usd: 0, base_url: "http://127.0.0.1:{up}/plain/v1", model: bench, max_concurrency: 100000}}]
  stream:
    dedicated: [{{name: nginx-stream, gpu_hour_usd: 0, base_url: "http://127.0.0.1:{up}/stream/v1", model: bench, max_concurrency: 100000}}]
"""
CLIENTS = ("redis-py", "glide", "coredis")


@dataclass(frozen=True)
class Variant:
    name: str
    redis: bool
    workers: int = 1
    record: bool = True
    floor: bool = False
    client: str | None = None  # a maintained client in place of our line (bench/redis_clients.py)
    cluster: bool = False  # the Redis store on a Redis Cluster
    tree: Path | None = None  # an earlier source tree (`--before`)


VARIANTS = {
    "floor": Variant("floor", redis=False, floor=True),
    "memory": Variant("memory", redis=False),
    "redis": Variant("redis", redis=True),
    "redis-2w": Variant("redis-2w", redis=True, workers=2),
    "redis-norec": Variant("redis-norec", redis=True, record=False),
    **{client: Variant(client, redis=True, client=client) for client in CLIENTS},
    "cluster": Variant("cluster", redis=True, cluster=True),
}


@dataclass(frozen=True)
class Gateway:
    variant: Variant
    port: int
    pid: int


def main() -> None:
    args = _arguments()
    variants = _variants(args)
    redis_server = shutil.which("redis-server")
    if any(v.redis for v in variants) and redis_server is None:
        raise SystemExit("redis-server not found: apt-get install -y redis-server")
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    with tempfile.TemporaryDirectory() as tmp:
        up, redis_port = free_port(), free_port()
        procs = [start_nginx(Path(tmp), up, cpu=1)]
        if redis_server is not None:
            redis = [redis_server, "--port", str(redis_port), "--save", "", "--appendonly", "no"]
            procs.append(subprocess.Popen(["taskset", "-c", "1", *redis], stdout=subprocess.DEVNULL))
        cluster = RedisClusterServers(tmp).start() if any(v.cluster for v in variants) else None
        urls = {False: f"redis://127.0.0.1:{redis_port}/0", True: cluster.url if cluster else ""}
        try:
            wait_for(f"http://127.0.0.1:{up}/missing-is-fine")
            gateways = [start_gateway(v, Path(tmp), up, urls[v.cluster], procs) for v in variants]
            rows = asyncio.run(measure(up, gateways, args))
        finally:
            for p in reversed(procs):
                p.terminate()
                p.wait(timeout=30)
            if cluster is not None:
                cluster.stop()
    summaries.against_floor(rows, args.concurrency)
    names = {v.name for v in variants}
    if args.before is not None:
        pairs = [(f"{name}@before", name) for name in ("memory", "redis") if f"{name}@before" in names]
        over = summaries.against(rows, pairs, summaries.BEFORE_LIMIT, f"this tree / {args.before}")
        print(f"\nrows worse than the earlier tree by more than 5% (CPU per request): {over}")
    clients = [c for c in (*CLIENTS, "cluster") if c in names]
    if clients:
        pairs = [("redis", client) for client in clients]
        title = "maintained Redis clients / our own line (the Redis store, one worker)"
        over = summaries.against(rows, pairs, summaries.CLIENT_LIMIT, title)
        print(f"\nclient rows over 1.10x our line's CPU per request: {over}")


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="per round and variant")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds per row (median CPU)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument(
        "--variants", nargs="+", choices=sorted(VARIANTS), default=["floor", "memory", "redis", "redis-2w"]
    )
    parser.add_argument("--clients", action="store_true", help="add redis-py, glide, coredis and cluster")
    parser.add_argument(
        "--before", type=Path, metavar="DIR", help="add memory and redis from this source tree"
    )
    return parser.parse_args()


def _variants(args: argparse.Namespace) -> list[Variant]:
    names = list(dict.fromkeys(args.variants + (["redis", *CLIENTS, "cluster"] if args.clients else [])))
    variants = [VARIANTS[name] for name in names]
    for variant in variants:
        if variant.client is not None and (install := missing(variant.client)) is not None:
            raise SystemExit(f"--variants {variant.client} needs it installed: {install}")
    if args.before is not None:
        if not (args.before / "router" / "cli").is_dir():
            raise SystemExit(f"--before {args.before}: not a tidegate source tree (no router/cli)")
        for name in ("memory", "redis"):
            if name in names:
                variants.append(Variant(f"{name}@before", redis=name == "redis", tree=args.before.resolve()))
    return variants


def start_gateway(
    variant: Variant, tmp: Path, up: int, redis_url: str, procs: list[subprocess.Popen[bytes]]
) -> Gateway:
    port = free_port()
    env = os.environ.copy()
    cwd = variant.tree or Path.cwd()
    if variant.floor:
        command = [sys.executable, "-m", "bench.floor", f"http://127.0.0.1:{up}", str(port)]
    else:
        redis_url = redis_url if variant.redis else ""
        config = tmp / f"tidegate-{variant.name}.yaml"
        record = str(variant.record).lower()
        config.write_text(GATEWAY_CONF.format(port=port, up=up, redis_url=redis_url, record=record))
        older = not (cwd / "tidegate" / "__main__.py").exists()  # an earlier tree: router.cli
        command_module = "router.cli" if older else "tidegate"
        entry = ["bench.redis_clients", variant.client] if variant.client else [command_module]
        command = [sys.executable, "-m", *entry, "--log-level", "info"]  # access log on, as in production
        command += ["serve", "--config", str(config), "--workers", str(variant.workers)]
        if variant.tree is not None:
            env["PYTHONPATH"] = str(variant.tree)
    gateway = subprocess.Popen(
        ["taskset", "-c", "0", *command],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs.append(gateway)
    wait_for(
        f"http://127.0.0.1:{port}/v1/chat/completions"
        if variant.floor
        else f"http://127.0.0.1:{port}/healthz"
    )
    return Gateway(variant, port, gateway.pid)


async def measure(up: int, gateways: list[Gateway], args: argparse.Namespace) -> Rows:
    """Each row's variants run in `--rounds` interleaved rounds (direct, then each gateway, then
    again, every other round in reverse order), so a slow spell of a noisy machine falls on
    every variant alike; a row reports the median CPU per request over its rounds and the
    latencies of all rounds pooled."""
    rows: Rows = {}
    summaries.print_header()
    for stream in (False, True):
        path = "stream" if stream else "plain"
        for conc in args.concurrency:
            directs: list[Run] = []
            runs: dict[str, list[Run]] = {gw.variant.name: [] for gw in gateways}
            cpus: dict[str, list[float]] = {gw.variant.name: [] for gw in gateways}
            for round_ in range(args.rounds):
                direct_url = f"http://127.0.0.1:{up}/{path}/v1/chat/completions"
                directs.append(await load(direct_url, "bench", stream, conc, args.seconds))
                for gw in gateways if round_ % 2 == 0 else gateways[::-1]:  # no variant always first
                    before = cpu_seconds(gw.pid)
                    url = f"http://127.0.0.1:{gw.port}/v1/chat/completions"
                    via = await load(url, path, stream, conc, args.seconds)
                    cpus[gw.variant.name].append((cpu_seconds(gw.pid) - before) * 1000 / max(1, via.requests))
                    runs[gw.variant.name].append(via)
            direct = pooled(directs)
            summaries.print_row(path, conc, "direct", direct, "")
            for gw in gateways:
                name = gw.variant.name
                via = pooled(runs[name])
                row = rows[(path, conc, name)] = _row(via, direct, statistics.median(cpus[name]))
                added_p99 = pct(via.ttfts, 0.99) - pct(direct.ttfts, 0.99)
                extra = f"{row.cpu_ms:>10.3f} {row.added_p50:>12.3f}ms {added_p99:>6.2f}ms"
                summaries.print_row(path, conc, name, via, extra)
    return rows


def _row(via: Run, direct: Run, cpu_ms: float) -> Row:
    added_p50 = pct(via.ttfts, 0.5) - pct(direct.ttfts, 0.5)
    return Row(
        cpu_ms, added_p50, pct(via.latencies, 0.5), pct(via.latencies, 0.99), via.requests / via.seconds
    )


if __name__ == "__main__":
    main()
