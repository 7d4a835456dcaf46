"""`tidegate replay`: open-loop replay of a trace against a running gateway (or any OpenAI
endpoint), usually `tidegate serve` in front of `tidegate sim` processes.

Each row is sent at its arrival time divided by `--speed`, whatever the answers do: a closed
loop would hide the queueing the replay is there to see. A row becomes a streaming chat request
whose prompt and answer sizes reach the simulator as `x-sim-prompt-tokens` and
`x-sim-output-tokens` headers (the gateway passes them on), so nobody builds real 2,000-token
prompts. Per request: send lag, TTFT and e2e as the client saw them, and the gateway's route,
reason and outcome headers. The summary (router/replay.py) says whether the sender kept up;
a replay that fell behind is marked invalid, not reported as a result.

    tidegate replay TRACE --url URL [--model M] [--start MIN] [--minutes N] [--speed K]
                    [--scale-rate X] [--slo-ttft-ms 2000] [--out DIR] [--max-in-flight 4096]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from router.replay import Arrival, load, scale_rate, summary, window

LAG_P99_MS = 50.0  # a sender later than this at p99 did not keep up


async def send(
    client: httpx.AsyncClient, url: str, model: str, row: Arrival, *, index: int, headers: dict[str, str]
) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"replayed row {index}"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sizes = {"x-sim-prompt-tokens": str(row.input_tokens), "x-sim-output-tokens": str(row.output_tokens)}
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
        async with client.stream("POST", url, json=body, headers=headers | sizes) as answer:
            record["status"] = answer.status_code
            for name in ("route", "reason", "outcome"):
                record[name] = answer.headers.get(f"x-tidegate-{name}")
            if answer.status_code != 200:
                await answer.aread()
                return record
            first = None
            async for line in answer.aiter_lines():
                if first is None and line.startswith("data:") and '"content"' in line:
                    first = time.perf_counter()
                if line.startswith("event: error"):
                    return record | {"error": "stream_error"}
            record["ttft_ms"] = None if first is None else (first - started) * 1000
            record["e2e_ms"] = (time.perf_counter() - started) * 1000
            record["ok"] = first is not None
    except httpx.HTTPError as exc:
        record["error"] = type(exc).__name__
    return record


async def replay(rows: list[Arrival], args: argparse.Namespace, console: Console) -> list[dict[str, Any]]:
    """Send every row on schedule; rows that would exceed --max-in-flight are not sent."""
    url = args.url.rstrip("/").removesuffix("/v1") + "/v1/chat/completions"
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.max_in_flight, max_keepalive_connections=256)
    records: list[dict[str, Any]] = []
    in_flight: set[asyncio.Task[dict[str, Any]]] = set()
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout_s), limits=limits) as client:
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
    try:
        rows = window(load(Path(args.trace), args.format), args.start, args.minutes)
        rows = scale_rate(rows, args.scale_rate, seed=args.seed)
    except (OSError, ValueError, KeyError) as exc:
        console.print(f"tidegate replay: {exc}")
        return 2
    if not rows:
        console.print("tidegate replay: no rows in that window")
        return 2
    span_s = rows[-1].at_s / args.speed
    console.print(
        f"replaying {len(rows)} requests over {span_s:.0f}s (trace minutes {args.start:g}+, "
        f"rate x{args.scale_rate:g}, speed x{args.speed:g}) to {args.url}"
    )
    if args.speed != 1:
        console.print(
            f"note: at --speed {args.speed:g} the simulators need --time-scale {args.speed:g}, and the "
            "gateway's own time constants (windows, dwell, TTLs, timeouts) must be divided by it too, "
            "or the replay is not the system"
        )
    results = asyncio.run(replay(rows, args, console))
    found = summary(results, args.slo_ttft_ms, LAG_P99_MS)
    found["trace"] = {
        "path": str(args.trace),
        "start_min": args.start,
        "minutes": args.minutes,
        "scale_rate": args.scale_rate,
        "speed": args.speed,
    }
    out = args.out or Path(f"replay-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay.json").write_bytes(orjson.dumps(found, option=orjson.OPT_INDENT_2))
    with (out / "requests.jsonl").open("wb") as f:
        for record in results:
            f.write(orjson.dumps(record) + b"\n")
    verdict = "valid" if found["client_kept_up"] else "INVALID: the sender fell behind its schedule"
    ttft = found["ttft_ms"]
    print(
        f"{found['sent']} sent, {found['succeeded']} answered, {found['errors']} errors; "
        f"SLO (TTFT <= {args.slo_ttft_ms:g} ms) met by {found['slo_attainment']:.1%}; "
        f"TTFT p50 {ttft['p50']} p95 {ttft['p95']} p99 {ttft['p99']} ms; spill share {found['spill_share']}; "
        f"send lag p99 {found['send_lag_ms']['p99']} ms ({verdict}); results: {out}"
    )
    return 0 if found["client_kept_up"] else 3


def add_parser(commands: Any) -> None:
    replay_cmd = commands.add_parser("replay", help="open-loop replay of a trace against a running gateway")
    replay_cmd.add_argument("trace", help="Azure CSV, Mooncake JSONL or a tidegate access log")
    replay_cmd.add_argument("--url", required=True, help="the gateway (or endpoint) base URL")
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
