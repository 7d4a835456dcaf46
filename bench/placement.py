"""Placement among a pool's replicas, measured (issue 38): a slice of the Mooncake conversation
trace replayed through `tidegate serve` onto `--replicas` simulated replicas with prefix caches
and one serverless simulator for spill, once per placement mode, side by side in one run.

    python -m bench.placement [--start 20] [--minutes 8] [--speed 4] [--replicas 4]
                              [--slots 16] [--engine llama-8b-h100]
                              [--modes listed round_robin least_loaded scored] [--out DIR]

Per mode, fresh processes (every replica's prefix cache starts cold): `tidegate sim` replicas
with the `--engine` calibration (the shared-step engine of router/engine; `llama-8b-h100`:
prefill 25k tokens/s, a 415k-token KV cache) and a prefix cache of 90% of its KV cache in
16-token blocks, all at `--time-scale K`; a serverless simulator of the same model family; the gateway with the pool as one `replica_urls`
entry, time-lapsed by K; `tidegate replay` of the slice at `--speed K` (the trace's `hash_ids`
become shared prompt text, so the prefix structure reaches the gateway and the simulators).
Printed per mode: TTFT p50 and p95 (trace time), the prefill tokens the replicas computed, the
share of prompt tokens their caches served, the spill share, and the answers that failed.

The placer and the simulator share no code: the placer hashes 512-byte blocks of the request
JSON it forwards and remembers what it sent where; the simulator hashes 16-token blocks of the
prompt it receives and evicts in LRU order. The placer's index remembers as many blocks as the
replica's cache holds (`index_blocks` = cache tokens x 4 bytes / 512), as docs/routing.md tells
an operator to size it. The weights are the defaults (`scored`), untuned.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.servers import CliProcess  # the suite's own `tidegate ...` process helper
from tidegate.offline.calibration import DEDICATED as ENGINES
from tidegate.offline.timelapse import scale_config

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "traces" / "mooncake_conversation_trace.jsonl"
MODES = ("listed", "round_robin", "least_loaded", "scored")
SPILL_TO = {"llama-8b-h100": "llama-8b-together", "llama-70b-fp8-2xh100": "llama-70b-together"}
CACHE_SHARE = 0.9  # of a replica's KV cache, held as prefix cache
BYTES_PER_TOKEN, INDEX_BLOCK_BYTES = 4, 512  # the simulator's token; the placer's default block


def cache_tokens(engine: str) -> int:
    return int(ENGINES[engine].kv_capacity_tokens * CACHE_SHARE)
SLO_TTFT_MS = 2000.0


def gateway_config(mode: str, replicas: list[str], serverless: str, slots: int, engine: str) -> str:
    urls = ", ".join(f"'{url}'" for url in replicas)
    index_blocks = cache_tokens(engine) * BYTES_PER_TOKEN // INDEX_BLOCK_BYTES
    gpus, usd = ENGINES[engine].gpus, ENGINES[engine].gpu_hour_usd
    return (
        "auth: {allow_anonymous: true}\n"
        "state: {window_s: 60}\n"
        "models:\n  m:\n"
        f"    routing: {{placement: {{mode: {mode}, index_blocks: {index_blocks}}}}}\n"
        "    dedicated:\n"
        f"      - {{name: vllm, model: m, replica_urls: [{urls}], max_concurrency: {slots}, gpu_hour_usd: {usd}, gpus: {gpus}}}\n"
        "    serverless:\n"
        f"      - {{name: spill, model: m, base_url: '{serverless}', usd_per_mtok_in: 0.88, usd_per_mtok_out: 0.88}}\n"
    )


@contextmanager
def system(mode: str, args: argparse.Namespace, workdir: Path) -> Iterator[tuple[str, list[str]]]:
    """Fresh simulators and a time-lapsed gateway; yields its URL and the replicas' roots."""
    common = ("--time-scale", f"{args.speed:g}", "--port", "0", "--tokens-per-write", "16")
    with ExitStack() as stack:
        replicas = [
            stack.enter_context(
                CliProcess(
                    "sim", "--profile", "dedicated", "--calibration", args.engine, "--seed", str(7 + i),
                    "--max-concurrency", str(args.slots), "--prefix-cache-tokens", str(cache_tokens(args.engine)),
                    *common,
                )
            )
            for i in range(args.replicas)
        ]
        serverless = stack.enter_context(
            CliProcess("sim", "--profile", "serverless", "--calibration", SPILL_TO[args.engine], "--seed", "99", *common)
        )
        config = workdir / "gateway.yaml"
        urls = [r.url for r in replicas]
        config.write_text(gateway_config(mode, urls, serverless.url, args.slots, args.engine))
        scaled = workdir / f"gateway.x{args.speed:g}.yaml"
        scaled.write_text(scale_config(config.read_text(), args.speed, os.environ))
        gateway = stack.enter_context(
            CliProcess("--log-level", "warning", "serve", "--config", str(scaled), "--port", "0")
        )
        yield gateway.url, [r.root for r in replicas]


def measure(mode: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    with system(mode, args, workdir) as (url, replicas):
        done = subprocess.run(
            [
                sys.executable, "-m", "tidegate", "replay", str(args.trace), "--url", url, "--model", "m",
                "--start", f"{args.start:g}", "--minutes", f"{args.minutes:g}", "--speed", f"{args.speed:g}",
                "--slo-ttft-ms", f"{SLO_TTFT_MS:g}", "--out", str(workdir / "replay"),
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=args.minutes * 60 / args.speed + 300,
        )
        stats = [httpx.get(root + "/sim/stats", timeout=10).json() for root in replicas]
    if done.returncode not in (0, 3):
        raise RuntimeError(f"replay under {mode} failed:\n{done.stdout}\n{done.stderr[-2000:]}")
    found: dict[str, Any] = orjson.loads((workdir / "replay" / "replay.json").read_bytes())
    computed = sum(s["prefill_tokens"] for s in stats)
    hits = sum(s["prefix_hit_tokens"] for s in stats)
    return found | {
        "mode": mode,
        "prefill_tokens": computed,
        "prefix_hit_rate": round(hits / (hits + computed), 4) if hits + computed else None,
        "per_replica_requests": [s["requests"] for s in stats],
    }


def row(m: dict[str, Any]) -> str:
    ttft = m["ttft_ms"]
    kept = "" if m["client_kept_up"] else " (sender fell behind)"
    return (
        f"| {m['mode']} | {ttft['p50']:,.0f} | {ttft['p95']:,.0f} | {m['prefill_tokens'] / 1e6:.2f} M "
        f"| {m['prefix_hit_rate']:.1%} | {m['spill_share']:.1%} | {m['errors']} "
        f"| {'/'.join(str(n) for n in m['per_replica_requests'])}{kept} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--start", type=float, default=20.0, help="trace minute to start at")
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--speed", type=float, default=4.0)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--slots", type=int, default=16, help="max_concurrency per replica")
    parser.add_argument("--engine", choices=sorted(SPILL_TO), default="llama-8b-h100", help="the replicas' calibration")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="placement-"))
    print(f"python -m bench.placement {' '.join(sys.argv[1:])}  (work files: {out})", flush=True)
    print("| placement | TTFT p50 ms | TTFT p95 ms | prefill computed | cache hit | spill | errors | requests per replica |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    results = []
    for mode in args.modes:
        measured = measure(mode, args, out / mode)
        results.append(measured)
        print(row(measured), flush=True)
    (out / "placement.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
