"""Hedging against a stalling dedicated endpoint, measured (issue 18): the same open-loop
stream traffic through `tidegate serve`, once without `hedge` and once with it, side by side.

The dedicated simulator stalls `--stall-rate` of its first tokens for `--stall-s` (the issue's
10% for 5 s); the serverless one has the `deepseek-a` field-note TTFT (0.39 s median). Each run
gets fresh simulators with the same seeds and the same Poisson arrivals. First the serverless
simulator's own p95 TTFT is measured directly, so the target (`after_ms` + serverless p95) is a
figure of this run, not a constant.

    python -m bench.hedge [--requests 400] [--rate 10] [--after-ms 500] [--max-percent 20]
                          [--stall-rate 0.1] [--stall-s 5] [--out DIR]

Prints, per run: TTFT p50/p95/p99/max as the client saw it, the hedged share, the winners, the
prompt tokens paid twice (share of all prompt tokens sent) and the losers the dedicated
simulator counted as cancelled; writes hedge.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

from bench.streams import first_token_s, percentile
from tests.servers import CliProcess  # the suite's own `tidegate ...` process helper

PROMPT = "x" * 800  # ~200 prompt tokens by the gateway's estimate and the simulator's count
MAX_TOKENS = 16
SEED = 7


@dataclass(slots=True)
class Run:
    name: str
    ttft_s: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    winners: Counter[str] = field(default_factory=Counter)
    failed: int = 0
    duplicate_tokens_in: float = 0.0
    tokens_in: float = 0.0
    cancelled: int = 0
    stalls: int = 0


@contextmanager
def simulators(args: argparse.Namespace) -> Iterator[tuple[CliProcess, CliProcess]]:
    common = ["--time-scale", "1", "--answer-tokens-p50", "0"]
    with ExitStack() as stack:
        ded = stack.enter_context(
            CliProcess(
                "sim",
                "--profile",
                "dedicated",
                "--port",
                "0",
                "--seed",
                "1",
                "--max-concurrency",
                "256",
                "--itl-ms",
                "20",
                "--stall-rate",
                str(args.stall_rate),
                "--stall-s",
                str(args.stall_s),
                *common,
            )
        )
        sl = stack.enter_context(
            CliProcess(
                "sim",
                "--profile",
                "serverless",
                "--port",
                "0",
                "--seed",
                "2",
                "--preset",
                "deepseek-a",
                *common,
            )
        )
        yield ded, sl


def config_text(ded: str, sl: str, hedge: str) -> str:
    return (
        "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
        f"{hedge}"
        f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded}', model: d, max_concurrency: 256}}]\n"
        f"    serverless: [{{name: sl, base_url: '{sl}', model: s, usd_per_mtok_in: 0.55, usd_per_mtok_out: 2.19}}]\n"
    )


async def one(client: httpx.AsyncClient, url: str, run: Run) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }
    first, response = await first_token_s(client, url, body)
    if first is None or response is None:
        run.failed += 1
        return
    run.ttft_s.append(first)
    outcome = response.headers.get("x-tidegate-outcome", "-")
    run.outcomes[outcome] += 1
    if outcome == "hedged_ok":
        run.winners[response.headers.get("x-tidegate-kind", "-")] += 1


async def open_loop(url: str, requests: int, rate: float, run: Run) -> None:
    """Poisson arrivals at `rate`/s (seeded): never paced by the answers."""
    rng = random.Random(SEED)
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        tasks = []
        start = time.monotonic()
        at = 0.0
        for _ in range(requests):
            at += rng.expovariate(rate)
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client, url, run)))
        await asyncio.gather(*tasks)


def metric_sum(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def measure(args: argparse.Namespace, name: str, hedge: str, workdir: Path) -> Run:
    run = Run(name)
    with simulators(args) as (ded, sl):
        path = workdir / f"{name}.yaml"
        path.write_text(config_text(ded.url, sl.url, hedge))
        with CliProcess("--log-level", "warning", "serve", "--config", str(path), "--port", "0") as gw:
            asyncio.run(open_loop(gw.url, args.requests, args.rate, run))
            base = gw.url.removesuffix("/v1")
            deadline = time.monotonic() + 30
            stats = httpx.get(ded.url.removesuffix("/v1") + "/sim/stats").json()
            while stats["in_flight"] and time.monotonic() < deadline:  # the losers wind down
                time.sleep(0.1)
                stats = httpx.get(ded.url.removesuffix("/v1") + "/sim/stats").json()
            metrics = httpx.get(base + "/metrics").text
            run.duplicate_tokens_in = metric_sum(metrics, "tidegate_hedge_duplicate_input_tokens_total")
            run.cancelled = stats["cancelled"]
            run.stalls = stats["faults"].get("stall", 0)
            sl_stats = httpx.get(sl.url.removesuffix("/v1") + "/sim/stats").json()
            run.tokens_in = (
                stats["usage_prompt_tokens"] + sl_stats["usage_prompt_tokens"] + run.duplicate_tokens_in
            )
    return run


def serverless_p95(args: argparse.Namespace) -> float:
    run = Run("serverless direct")
    with simulators(args) as (_, sl):
        asyncio.run(open_loop(sl.url, args.requests, args.rate, run))
    return percentile(run.ttft_s, 95)


def main() -> None:
    args = _arguments()
    sl_p95 = serverless_p95(args)
    hedge = f"    hedge: {{after_ms: {args.after_ms:g}, max_percent: {args.max_percent:g}}}\n"
    with tempfile.TemporaryDirectory() as tmp:
        runs = [measure(args, "no hedge", "", Path(tmp)), measure(args, "hedge", hedge, Path(tmp))]
    target = args.after_ms / 1000 + sl_p95
    print(
        f"{args.requests} streams at {args.rate:g}/s; dedicated stalls {args.stall_rate:.0%} of first tokens "
        f"for {args.stall_s:g} s; serverless p95 TTFT {sl_p95 * 1000:.0f} ms (measured directly)"
    )
    print(
        f"target: p99 TTFT < after_ms + serverless p95 = {target * 1000:.0f} ms; duplicate share <= {args.max_percent:g}%"
    )
    header = f"{'run':<10}{'p50 ms':>8}{'p95 ms':>8}{'p99 ms':>8}{'max ms':>8}{'hedged':>8}{'won by sl':>10}{'dup tokens':>11}{'cancelled':>10}{'stalls':>7}{'failed':>7}"
    print(header)
    print("-" * len(header))
    report = {
        "serverless_p95_s": sl_p95,
        "target_s": target,
        "args": {k: str(v) for k, v in vars(args).items()},
        "runs": [_print_run(run) for run in runs],
    }
    hedged = runs[1]
    met = (
        percentile(hedged.ttft_s, 99) < target
        and hedged.duplicate_tokens_in / max(1.0, hedged.tokens_in) <= args.max_percent / 100
    )
    print(
        f"with hedging: p99 {'under' if met else 'NOT under'} the target, duplicate share within max_percent: {met}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hedge.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate", type=float, default=10.0, help="arrivals per second")
    parser.add_argument("--after-ms", type=float, default=500.0)
    parser.add_argument("--max-percent", type=float, default=20.0)
    parser.add_argument("--stall-rate", type=float, default=0.1)
    parser.add_argument("--stall-s", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    return parser.parse_args()


def _print_run(run: Run) -> dict[str, object]:
    """One run's row of the table; its figures for hedge.json."""
    hedged = run.outcomes.get("hedged_ok", 0)
    share = hedged / max(1, len(run.ttft_s))
    dup_share = run.duplicate_tokens_in / max(1.0, run.tokens_in)
    print(
        f"{run.name:<10}{percentile(run.ttft_s, 50) * 1000:>8.0f}{percentile(run.ttft_s, 95) * 1000:>8.0f}"
        f"{percentile(run.ttft_s, 99) * 1000:>8.0f}{max(run.ttft_s) * 1000:>8.0f}{share:>8.1%}"
        f"{run.winners.get('serverless', 0):>10}{dup_share:>11.1%}{run.cancelled:>10}{run.stalls:>7}{run.failed:>7}"
    )
    return {
        "name": run.name,
        "ttft_p50_s": percentile(run.ttft_s, 50),
        "ttft_p95_s": percentile(run.ttft_s, 95),
        "ttft_p99_s": percentile(run.ttft_s, 99),
        "ttft_max_s": max(run.ttft_s),
        "hedged_share": share,
        "winners": dict(run.winners),
        "duplicate_tokens_in_share": dup_share,
        "cancelled_at_dedicated": run.cancelled,
        "stalls": run.stalls,
        "failed": run.failed,
    }


if __name__ == "__main__":
    main()
