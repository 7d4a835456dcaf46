"""Batch traffic filling idle dedicated capacity, measured (issue 30): one seeded open-loop
interactive stream through `tidegate serve`, in three runs side by side:

- `alone`: the interactive stream only;
- `batch`: the same stream plus a batch backlog (`--batch` requests from `--workers` workers,
  a batch job's pool) sent with a `priority: batch` key;
- `all interactive`: the same stream and the same backlog, the backlog with an interactive key.

    python -m bench.priority [--requests 400] [--rate 4] [--batch 400] [--workers 24]
                             [--capacity 24] [--reserve 18] [--out DIR]

Prints per run: the interactive stream's TTFT p50/p95/p99 as its client saw it, where it went,
the dedicated pool's utilization over the run, the serverless spend, and the backlog's
completions; writes priority.json.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.streams import first_token_s, percentile
from tests.servers import CliProcess  # the suite's own `tidegate ...` process helper

PROMPT = "x" * 400
MAX_TOKENS = 64
SEED = 7
ADMIN = "bench-admin"
KEYS = {"app": "sk-bench-app", "nightly": "sk-bench-nightly", "nightly-i": "sk-bench-nightly-i"}


def config_text(ded: str, sl: str, args: argparse.Namespace) -> str:
    def key(name: str, priority: str) -> str:
        digest = hashlib.sha256(KEYS[name].encode()).hexdigest()
        return f"    - {{name: {name}, priority: {priority}, key_sha256: {digest}}}\n"

    return (
        f"auth:\n  admin_key: {ADMIN}\n  keys:\n"
        + key("app", "interactive")
        + key("nightly", "batch")
        + key("nightly-i", "interactive")
        + "models:\n  m:\n"
        f"    routing: {{batch: {{max_wait_s: 600, reserve_slots: {args.reserve}}}}}\n"
        f"    dedicated: [{{name: ded, base_url: '{ded}', model: d, max_concurrency: {args.capacity},"
        " gpu_hour_usd: 4.41}]\n"
        f"    serverless: [{{name: sl, base_url: '{sl}', model: s, usd_per_mtok_in: 0.55, usd_per_mtok_out: 2.19}}]\n"
    )


async def one(client: httpx.AsyncClient, url: str, key: str, found: list[tuple[float, str]]) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }
    first, response = await first_token_s(client, url, body, {"authorization": f"Bearer {key}"})
    if first is not None and response is not None:
        found.append((first, response.headers.get("x-tidegate-route", "-")))


async def interactive(url: str, args: argparse.Namespace, found: list[tuple[float, str]]) -> None:
    rng = random.Random(SEED)
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=500)) as client:
        tasks, start, at = [], time.monotonic(), 0.0
        for _ in range(args.requests):
            at += rng.expovariate(args.rate)
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client, url, KEYS["app"], found)))
        await asyncio.gather(*tasks)


async def backlog(
    url: str, key: str, args: argparse.Namespace, done: list[tuple[float, str]], stop: asyncio.Event
) -> None:
    left = iter(range(args.batch))
    async with httpx.AsyncClient(timeout=700, limits=httpx.Limits(max_connections=args.workers)) as client:

        async def worker() -> None:
            for _ in left:
                if stop.is_set():
                    return
                await one(client, url, key, done)

        await asyncio.gather(*(worker() for _ in range(args.workers)))


async def run(url: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    found: list[tuple[float, str]] = []
    done: list[tuple[float, str]] = []
    stop = asyncio.Event()
    jobs = [interactive(url, args, found)]
    if mode != "alone":
        jobs.append(backlog(url, KEYS["nightly" if mode == "batch" else "nightly-i"], args, done, stop))
    started = time.monotonic()
    first = asyncio.create_task(jobs[0])
    rest = [asyncio.create_task(j) for j in jobs[1:]]
    await first
    stop.set()  # the backlog stops with the interactive stream: the same span for every run
    await asyncio.gather(*rest)
    return {"found": found, "done": done, "span_s": time.monotonic() - started}


def measure(args: argparse.Namespace, mode: str, workdir: Path) -> dict[str, Any]:
    sim = ["sim", "--port", "0", "--time-scale", "1", "--answer-tokens-p50", "0"]
    with ExitStack() as stack:
        ded = stack.enter_context(
            CliProcess(
                *sim, "--profile", "dedicated", "--seed", "1", "--max-concurrency", "256", "--itl-ms", "20"
            )
        )
        sl = stack.enter_context(
            CliProcess(*sim, "--profile", "serverless", "--seed", "2", "--preset", "deepseek-a")
        )
        path = workdir / f"{mode.replace(' ', '-')}.yaml"
        path.write_text(config_text(ded.url, sl.url, args))
        with CliProcess("--log-level", "warning", "serve", "--config", str(path), "--port", "0") as gw:
            got = asyncio.run(run(gw.url, mode, args))
            time.sleep(1.5)  # the last counters reach the store
            window = max(10, int(got["span_s"]) + 2)
            report = httpx.get(
                gw.root + f"/admin/routes?window={window}", headers={"authorization": f"Bearer {ADMIN}"}
            ).json()
    routes = report["models"]["m"]["routes"]
    economics = report["models"]["m"]["economics"]["routes"]
    ttft = [t for t, _ in got["found"]]
    return {
        "mode": mode,
        "interactive": {
            "answered": len(ttft),
            "ttft_ms": {q: round(percentile(ttft, q) * 1000, 1) for q in (50, 95, 99)},
            "routes": dict(Counter(r for _, r in got["found"])),
        },
        "backlog_done": len(got["done"]),
        "backlog_routes": dict(Counter(r for _, r in got["done"])),
        "dedicated_utilization": routes["ded"].get("utilization"),
        "utilization_without_batch": routes["ded"].get("utilization_without_batch"),
        "serverless_usd": economics["sl"]["cost_usd"] or 0.0,
        "span_s": round(got["span_s"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate", type=float, default=4.0)
    parser.add_argument("--batch", type=int, default=400)
    parser.add_argument("--workers", type=int, default=24)
    parser.add_argument("--capacity", type=int, default=24)
    parser.add_argument("--reserve", type=int, default=18)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("alone", "batch", "all interactive"):
            found = measure(args, mode, Path(tmp))
            runs.append(found)
            i = found["interactive"]
            print(
                f"{mode:>15}: interactive TTFT ms {i['ttft_ms']} routes {i['routes']}; backlog done "
                f"{found['backlog_done']} {found['backlog_routes']}; dedicated utilization "
                f"{found['dedicated_utilization']}; serverless ${found['serverless_usd']:.5f}",
                flush=True,
            )
    alone, batch, everyone = runs
    print(
        f"interactive p95: batch/alone {batch['interactive']['ttft_ms'][95] / alone['interactive']['ttft_ms'][95]:.3f}; "
        f"utilization batch {batch['dedicated_utilization']} vs alone {alone['dedicated_utilization']}; "
        f"serverless spend batch ${batch['serverless_usd']:.5f} vs all interactive ${everyone['serverless_usd']:.5f}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "priority.json").write_bytes(
        orjson.dumps(
            {"args": vars(args) | {"out": str(args.out)}, "runs": runs},
            option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS,
        )
    )
    print(f"wrote {args.out / 'priority.json'}")


if __name__ == "__main__":
    main()
