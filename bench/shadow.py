"""Shadow traffic's cost to the live request, measured (issue 29): the same open-loop stream
traffic through `tidegate serve`, with `shadow` off and with every request mirrored
(`percent: 100`) to a candidate simulator, in alternating runs (off, on, off, on, ...) so drift
of the machine falls on both sides alike.

    python -m bench.shadow [--requests 400] [--rate 20] [--pairs 2] [--out DIR]

Prints per run and per side: live TTFT p50/p95/p99 as the client saw it, the shadow requests
sent and dropped (tidegate_shadow_total), and the ratios on/off; writes shadow.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import orjson

from bench.streams import first_token_s, percentile
from tests.servers import CliProcess  # the suite's own `tidegate ...` process helper

PROMPT = "x" * 800
MAX_TOKENS = 16
SEED = 7


def config_text(ded: str, sl: str, cand: str, shadow: bool) -> str:
    block = (
        "    shadow:\n"
        f"      candidate: {{name: cand, base_url: '{cand}', model: c, usd_per_mtok_in: 0.2, usd_per_mtok_out: 0.6}}\n"
        "      percent: 100\n      max_in_flight: 64\n      compare: {agree: exact}\n"
        if shadow
        else ""
    )
    return (
        "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
        "    success: {finish_reasons: [stop, length]}\n"  # the simulators run every answer to max_tokens
        f"{block}"
        f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded}', model: d, max_concurrency: 256}}]\n"
        f"    serverless: [{{name: sl, base_url: '{sl}', model: s, usd_per_mtok_in: 0.55, usd_per_mtok_out: 2.19}}]\n"
    )


async def one(client: httpx.AsyncClient, url: str, ttft: list[float], failed: list[int]) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }
    first, _ = await first_token_s(client, url, body)
    if first is None:
        failed.append(1)
    else:
        ttft.append(first)


async def open_loop(url: str, requests: int, rate: float) -> tuple[list[float], int]:
    rng = random.Random(SEED)
    ttft: list[float] = []
    failed: list[int] = []
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        tasks, start, at = [], time.monotonic(), 0.0
        for _ in range(requests):
            at += rng.expovariate(rate)
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client, url, ttft, failed)))
        await asyncio.gather(*tasks)
    return ttft, len(failed)


def shadow_counts(metrics: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("tidegate_shadow_total{"):
            result = line.split('result="', 1)[1].split('"', 1)[0]
            found[result] = found.get(result, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def measure(args: argparse.Namespace, shadow: bool, workdir: Path) -> dict[str, object]:
    sim = ["sim", "--port", "0", "--time-scale", "1", "--answer-tokens-p50", "0"]
    with ExitStack() as stack:
        ded = stack.enter_context(
            CliProcess(
                *sim, "--profile", "dedicated", "--seed", "1", "--max-concurrency", "256", "--itl-ms", "20"
            )
        )
        sl = stack.enter_context(
            CliProcess(*sim, "--profile", "serverless", "--seed", "2", "--preset", "fast")
        )
        cand = stack.enter_context(
            CliProcess(*sim, "--profile", "serverless", "--seed", "3", "--preset", "deepseek-a")
        )
        path = workdir / f"{'on' if shadow else 'off'}.yaml"
        path.write_text(config_text(ded.url, sl.url, cand.url, shadow))
        with CliProcess("--log-level", "warning", "serve", "--config", str(path), "--port", "0") as gw:
            ttft, failed = asyncio.run(open_loop(gw.url, args.requests, args.rate))
            time.sleep(1.0)  # the last shadows land
            counts = shadow_counts(httpx.get(gw.root + "/metrics").text)
    return {
        "shadow": shadow,
        "requests": args.requests,
        "failed": failed,
        "ttft_ms": {q: round(percentile(ttft, q) * 1000, 1) for q in (50, 95, 99)},
        "shadow_results": counts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            for shadow in (False, True):
                found = measure(args, shadow, Path(tmp))
                runs.append(found)
                print(
                    f"pair {pair + 1} shadow {'on ' if shadow else 'off'}: TTFT ms {found['ttft_ms']}, "
                    f"failed {found['failed']}, shadow {found['shadow_results']}",
                    flush=True,
                )
    side = {
        on: {q: statistics.median(r["ttft_ms"][q] for r in runs if r["shadow"] is on) for q in (50, 95, 99)}  # type: ignore[index]
        for on in (False, True)
    }
    print(f"{args.requests} streams at {args.rate:g}/s, {args.pairs} pairs, median over runs:")
    for q in (50, 95, 99):
        print(
            f"  p{q}: off {side[False][q]:.1f} ms, on {side[True][q]:.1f} ms, on/off {side[True][q] / side[False][q]:.3f}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "shadow.json").write_bytes(
        orjson.dumps({"runs": runs, "median": side}, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    )
    print(f"wrote {args.out / 'shadow.json'}")


if __name__ == "__main__":
    main()
