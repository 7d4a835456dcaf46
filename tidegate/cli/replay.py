"""`tidegate replay`: open-loop replay of a trace against a running gateway (or any OpenAI
endpoint), usually `tidegate serve` in front of `tidegate sim` processes.

Each row is sent at its arrival time divided by `--speed`, whatever the answers do: a closed
loop would hide the queueing the replay is there to see. A row becomes a streaming chat request
whose prompt and answer sizes reach the simulator as `x-sim-prompt-tokens` and
`x-sim-output-tokens` headers (the gateway passes them on), so nobody builds real 2,000-token
prompts. Per request: send lag, TTFT and e2e as the client saw them, and the gateway's route,
reason and outcome headers. The summary (tidegate/offline/replay.py) says whether the sender kept up;
a replay that fell behind is marked invalid, not reported as a result.

With the gateway's `--config`, the summary also prices the replay: cost, cost per
SLO-successful task and dedicated utilization (tidegate/offline/replay.py). At `--speed K` the
simulators must run with `--time-scale K` and the gateway with its config time-lapsed by K
(`--scale-config`, tidegate/offline/timelapse.py); a gateway whose /readyz reports another time scale is
refused. Durations are reported in trace time.

    tidegate replay TRACE --url URL [--model M] [--config tidegate.yaml] [--start MIN] [--minutes N]
                    [--speed K] [--scale-rate X] [--slo-ttft-ms 2000] [--out DIR] [--max-in-flight 4096]
    tidegate replay --scale-config tidegate.yaml --speed K > tidegate.xK.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import uvloop
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from router.config import ConfigError, GatewayConfig, load_config
from router.openai import BYTES_PER_TOKEN
from tidegate.offline.replay import (
    MOONCAKE_BLOCK_TOKENS,
    Arrival,
    BlockArrival,
    Pricing,
    load,
    scale_rate,
    summary,
    window,
)
from tidegate.offline.timelapse import scale_config

LAG_P99_MS = 50.0  # a sender later than this at p99 did not keep up


_BODY_BYTES = 120  # a replayed request's JSON around its prompt


def prompt(index: int, tokens: int, blocks: tuple[int, ...] = ()) -> str:
    """A prompt whose body is about `tokens` tokens long by the gateway's estimate (router/
    openai.py: bytes / 4), so predicted-TTFT admission sees the trace's prompt sizes; the
    simulator takes the exact count from `x-sim-prompt-tokens`. With a Mooncake row's `blocks`
    the prompt is those blocks' texts in order (the same id, the same text), so rows sharing a
    prefix of ids share a prompt prefix for a prefix cache to find."""
    size = max(0, BYTES_PER_TOKEN * tokens - _BODY_BYTES)
    if blocks:
        return "".join(_block_text(h) for h in blocks)[:size]
    head = f"replayed row {index} "
    return head + "x" * max(0, size - len(head))


def _block_text(block: int) -> str:
    """The text of one of the trace's 512-token blocks: its id, repeated to its length."""
    size = MOONCAKE_BLOCK_TOKENS * BYTES_PER_TOKEN
    word = f"<block {block}> "
    return (word * (size // len(word) + 1))[:size]


def _blocks(row: Arrival) -> tuple[int, ...]:
    return row.blocks if isinstance(row, BlockArrival) else ()


async def send(
    client: aiohttp.ClientSession, url: str, model: str, row: Arrival, *, index: int, headers: dict[str, str]
) -> dict[str, Any]:
    body = orjson.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt(index, row.input_tokens, _blocks(row))}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    sizes = {
        "content-type": "application/json",
        "x-sim-prompt-tokens": str(row.input_tokens),
        "x-sim-output-tokens": str(row.output_tokens),
    }
    started = time.perf_counter()
    record: dict[str, Any] = {
        "index": index,
        "at_s": row.at_s,
        "input_tokens": row.input_tokens,
        "output_tokens": row.output_tokens,
        "sent": True,
        "ok": False,
    }
    try:
        async with client.post(url, data=body, headers=headers | sizes) as answer:
            record["status"] = answer.status
            for name in ("route", "reason", "outcome"):
                record[name] = answer.headers.get(f"x-tidegate-{name}")
            if answer.status != 200:
                await answer.read()
                return record
            first = None
            async for line in answer.content:
                if first is None and line.startswith(b"data:") and b'"content"' in line:
                    first = time.perf_counter()
                if line.startswith(b"event: error"):
                    return record | {"error": "stream_error"}
            record["ttft_ms"] = None if first is None else (first - started) * 1000
            record["e2e_ms"] = (time.perf_counter() - started) * 1000
            record["ok"] = first is not None
    except (aiohttp.ClientError, TimeoutError) as exc:
        record["error"] = type(exc).__name__
    return record


async def replay(rows: list[Arrival], args: argparse.Namespace, console: Console) -> list[dict[str, Any]]:
    """Send every row on schedule; rows that would exceed --max-in-flight are not sent. The
    sender is aiohttp: at a few hundred requests a second httpx's own client cost more CPU
    than the gateway under test, and a sender that falls behind invalidates the replay."""
    url = args.url.rstrip("/").removesuffix("/v1") + "/v1/chat/completions"
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    records: list[dict[str, Any]] = []
    in_flight: set[asyncio.Task[dict[str, Any]]] = set()
    connector = aiohttp.TCPConnector(limit=args.max_in_flight)
    timeout = aiohttp.ClientTimeout(total=args.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console
        ) as progress:
            sent_bar = progress.add_task("sent", total=len(rows))
            done_bar = progress.add_task("answered", total=len(rows))

            def finished(task: asyncio.Task[dict[str, Any]]) -> None:
                in_flight.discard(task)
                progress.advance(done_bar)

            start = time.perf_counter() + 0.2
            for index, row in enumerate(rows):
                due = start + row.at_s / args.speed
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                lag_ms = max(0.0, (time.perf_counter() - due) * 1000)
                progress.advance(sent_bar)
                if len(in_flight) >= args.max_in_flight:
                    records.append(
                        {
                            "index": index,
                            "at_s": row.at_s,
                            "input_tokens": row.input_tokens,
                            "output_tokens": row.output_tokens,
                            "sent": False,
                            "lag_ms": lag_ms,
                        }
                    )
                    progress.advance(done_bar)
                    continue
                task = asyncio.create_task(send(client, url, args.model, row, index=index, headers=headers))
                task.add_done_callback(finished)
                in_flight.add(task)
                records.append({"task": task, "lag_ms": lag_ms})
            results = []
            for entry in records:
                if "task" in entry:
                    found = await entry["task"]
                    results.append(found | {"lag_ms": entry["lag_ms"]})
                else:
                    results.append(entry)
    return results


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    if args.scale_config is not None:
        return _print_scaled(args, console)
    if args.trace is None or args.url is None:
        print("tidegate replay: give a TRACE and --url (or --scale-config CONFIG --speed K)", file=sys.stderr)
        return 2
    try:
        rows = window(load(Path(args.trace), args.format), args.start, args.minutes)
        rows = scale_rate(rows, args.scale_rate, seed=args.seed)
        pricing = None if args.config is None else pricing_of(load_config(args.config), args.model)
        refusal = _time_scale_refusal(args.url, args.speed)
    except (OSError, ValueError, KeyError, ConfigError) as exc:
        print(f"tidegate replay: {exc}", file=sys.stderr)
        return 2
    if refusal is not None:
        print(f"tidegate replay: {refusal}", file=sys.stderr)
        return 2
    if not rows:
        print("tidegate replay: no rows in that window", file=sys.stderr)
        return 2
    span_s = args.minutes * 60 if args.minutes is not None else rows[-1].at_s
    console.print(
        f"replaying {len(rows)} requests over {rows[-1].at_s / args.speed:.0f}s "
        f"(trace minutes {args.start:g}+, rate x{args.scale_rate:g}, speed x{args.speed:g}) to {args.url}"
    )
    results = [_in_trace_time(r, args.speed) for r in uvloop.run(replay(rows, args, console))]
    found = summary(results, args.slo_ttft_ms, LAG_P99_MS, pricing, span_s)
    found["trace"] = _trace_facts(args)
    out = args.out or Path(f"replay-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay.json").write_bytes(orjson.dumps(found, option=orjson.OPT_INDENT_2))
    with (out / "requests.jsonl").open("wb") as f:
        for record in results:
            f.write(orjson.dumps(record) + b"\n")
    _print_summary(found, args, out, pricing is not None, span_s)
    return 0 if found["client_kept_up"] else 3


def _trace_facts(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "path": str(args.trace),
        "start_min": args.start,
        "minutes": args.minutes,
        "scale_rate": args.scale_rate,
        "speed": args.speed,
        "times": "trace time: durations measured at --speed K were multiplied by K; the simulators ran "
        "with --time-scale K and the gateway with a config time-lapsed by K (its windows, dwell, TTLs, "
        "timeouts divided by K: tidegate replay --scale-config)"
        if args.speed != 1
        else "wall-clock",
    }


def _print_summary(
    found: dict[str, Any], args: argparse.Namespace, out: Path, priced: bool, span_s: float
) -> None:
    verdict = "valid" if found["client_kept_up"] else "INVALID: the sender fell behind its schedule"
    ttft = found["ttft_ms"]
    print(
        f"{found['sent']} sent, {found['succeeded']} answered, {found['errors']} errors; "
        f"SLO (TTFT <= {args.slo_ttft_ms:g} ms) met by {found['slo_attainment']:.1%}; "
        f"TTFT p50 {ttft['p50']} p95 {ttft['p95']} p99 {ttft['p99']} ms; spill share {found['spill_share']}; "
        f"send lag p99 {found['send_lag_ms']['p99']} ms ({verdict}); results: {out}"
    )
    if priced:
        per = found["cost_per_slo_success_usd"]
        print(
            f"cost ${found['cost_usd']:.4f} over {span_s / 60:g} trace minutes "
            f"(dedicated ${found['dedicated_usd']:.4f}, serverless ${found['serverless_usd']:.4f}); "
            f"per SLO-successful task {'-' if per is None else f'${per:.6f}'}; "
            f"dedicated utilization {found['dedicated_utilization']}"
        )


def pricing_of(config: GatewayConfig, model: str) -> Pricing:
    """The replay's prices from the gateway's config: its dedicated endpoints by provisioned
    time, its serverless endpoints by token."""
    found = config.models.get(model)
    if found is None:
        raise ValueError(f"--model {model} is not in the config (models: {', '.join(config.models)})")
    return Pricing(
        dedicated_usd_per_hour=sum(d.usd_per_hour for d in found.dedicated),
        dedicated_slots=sum(d.max_concurrency for d in found.dedicated),
        dedicated_routes=frozenset(d.name for d in found.dedicated),
        serverless_usd_per_mtok={s.name: (s.usd_per_mtok_in, s.usd_per_mtok_out) for s in found.serverless},
    )


def _in_trace_time(record: dict[str, Any], speed: float) -> dict[str, Any]:
    """Durations measured at --speed K are K times shorter than the trace's: scale them back
    (the send lag stays wall-clock: it judges the client, not the system)."""
    for key in ("ttft_ms", "e2e_ms"):
        if record.get(key) is not None:
            record[key] = record[key] * speed
    return record


def _time_scale_refusal(url: str, speed: float) -> str | None:
    """Why the gateway at `url` cannot be replayed at `speed` (None: it can): its time
    constants must have been divided by the same factor (GET /readyz reports it)."""
    ready = url.rstrip("/").removesuffix("/v1") + "/readyz"
    try:
        answer = httpx.get(ready, timeout=10.0)
        scale = float(answer.json().get("time_scale", 1.0)) if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        scale = None
    if scale is None:
        return (
            None if speed == 1 else f"--speed {speed:g} needs a tidegate gateway at {url} (no /readyz answer)"
        )
    if abs(scale - speed) > 1e-9:
        return (
            f"the gateway runs at time_scale {scale:g} but --speed is {speed:g}: its windows, dwell, TTLs "
            f"and timeouts would not match the trace's. Serve `tidegate replay --scale-config CONFIG "
            f"--speed {speed:g}` and start the simulators with --time-scale {speed:g}"
        )
    return None


def _print_scaled(args: argparse.Namespace, console: Console) -> int:
    try:
        text = args.scale_config.read_text(encoding="utf-8")
        print(scale_config(text, args.speed, os.environ), end="")
    except (OSError, ValueError, ConfigError) as exc:
        print(f"tidegate replay --scale-config: {exc}", file=sys.stderr)
        return 2
    return 0


def add_parser(commands: Any) -> None:
    replay_cmd = commands.add_parser("replay", help="open-loop replay of a trace against a running gateway")
    replay_cmd.add_argument("trace", nargs="?", help="Azure CSV, Mooncake JSONL or a tidegate access log")
    replay_cmd.add_argument("--url", help="the gateway (or endpoint) base URL")
    replay_cmd.add_argument(
        "--scale-config", type=Path, metavar="CONFIG", help="print CONFIG time-lapsed for --speed, and exit"
    )
    replay_cmd.add_argument(
        "--config", type=Path, help="the gateway's config: prices the replay (cost per SLO-successful task)"
    )
    replay_cmd.add_argument("--model", default="demo-model")
    replay_cmd.add_argument("--api-key", default="")
    replay_cmd.add_argument("--format", choices=("azure", "mooncake", "access-log"), help="default: detected")
    replay_cmd.add_argument("--start", type=float, default=0.0, help="trace minute to start at")
    replay_cmd.add_argument(
        "--minutes", type=float, default=None, help="how many trace minutes (default: all)"
    )
    replay_cmd.add_argument("--speed", type=float, default=1.0, help="divide arrival times by this")
    replay_cmd.add_argument("--scale-rate", type=float, default=1.0, help="multiply the arrival rate")
    replay_cmd.add_argument("--seed", type=int, default=0)
    replay_cmd.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    replay_cmd.add_argument("--timeout-s", type=float, default=300.0)
    replay_cmd.add_argument(
        "--max-in-flight", type=int, default=4096, help="more at once are not sent (counted)"
    )
    replay_cmd.add_argument("--out", type=Path)
    replay_cmd.set_defaults(run=run)
