"""`tidegate probe`: the field notes' TTFT consistency benchmark against configured endpoints.

Each endpoint is called **directly** (its `base_url`, model id and key from the config; no
routing): a streaming chat request at temperature 0, the same prompt every time, one at a time,
`--interval-s` apart. Per request: TTFT (first output token), mean ITL, e2e, output tokens,
status and error. Statistics: tidegate/offline/probe.py.

    tidegate probe --config FILE [--model M] [--endpoint NAME ...] [--requests 75] [--warmup 3]
                   [--interval-s 2] [--prompt TEXT] [--max-tokens 64] [--out DIR] [--yes]
                   [--every 1h --for 24h] [--apply URL] [--html]
    tidegate probe --compare DIR1 DIR2
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from router.cli.admin_client import AdminCallFailed, call_admin
from router.cli.options import add_options, admin_key_option
from router.config import ConfigError, Endpoint, GatewayConfig, ServerlessEndpoint, load_config
from router.economics.cost import token_cost_usd
from router.economics.routes_report import parse_window
from tidegate.cli.probe_output import compare, hours_table, plots, table, write_html
from tidegate.offline.probe import ProbeResult, by_hour, ranking, summarise

DEFAULT_PROMPT = "In one short paragraph, explain what a load balancer does."


@dataclass(frozen=True, slots=True)
class Target:
    model: str
    endpoint: Endpoint


def targets(config: GatewayConfig, model: str | None, names: Sequence[str]) -> list[Target]:
    """The endpoints to probe; a name or model that is not configured is an error."""
    chosen = []
    for name, m in config.models.items():
        if model is not None and name != model:
            continue
        for endpoint in m.endpoints:
            if not names or endpoint.name in names:
                chosen.append(Target(name, endpoint))
    if model is not None and model not in config.models:
        raise SystemExit(f"--model {model}: not in the config (models: {', '.join(config.models)})")
    missing = set(names) - {t.endpoint.name for t in chosen}
    if missing:
        raise SystemExit(f"--endpoint {', '.join(sorted(missing))}: not an endpoint of the chosen model(s)")
    unique: dict[str, Target] = {}
    for target in chosen:  # a dedicated pool shared by models is probed once
        unique.setdefault(target.endpoint.name, target)
    return list(unique.values())


def estimate(
    targets_: Sequence[Target], requests: int, prompt: str, max_tokens: int
) -> list[tuple[str, str]]:
    """Per endpoint: requests planned and their worst-case cost (prompt and max_tokens)."""
    prompt_tokens = len(prompt) // 4 + 8  # a rough count: chat framing plus ~4 characters a token
    lines = []
    for t in targets_:
        if isinstance(t.endpoint, ServerlessEndpoint):
            usd = requests * token_cost_usd(
                prompt_tokens, max_tokens, t.endpoint.usd_per_mtok_in, t.endpoint.usd_per_mtok_out
            )
            cost = f"at most ${usd:.4f}"
        else:
            cost = "provisioned (already paid)"
        lines.append((t.endpoint.name, f"{requests} requests, {cost}"))
    return lines


def probe_once(
    client: httpx.Client, target: Target, index: int, *, warmup: bool, prompt: str, max_tokens: int
) -> ProbeResult:
    """One streaming request, timed from send to the first output token and to the end."""
    endpoint = target.endpoint
    body = {
        "model": endpoint.model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    started_wall, started = time.time(), time.perf_counter()
    first = last = None
    events, tokens, status = 0, None, None

    def result(error: str | None, ttft: float | None = None, itl: float | None = None) -> ProbeResult:
        e2e = (time.perf_counter() - started) * 1000 if error is None else None
        count = (tokens if tokens is not None else events) if error is None else None
        return ProbeResult(endpoint.name, index, started_wall, warmup, status, error, ttft, itl, e2e, count)

    url = endpoint.base_url.rstrip("/") + "/chat/completions"
    try:
        with client.stream("POST", url, json=body, headers=headers) as answer:
            status = answer.status_code
            if status != 200:
                answer.read()
                return result(f"http_{status}")
            for line in answer.iter_lines():
                data = line[5:].strip() if line.startswith("data:") else ""
                if data == "[DONE]":
                    break
                if not data:
                    continue
                chunk = orjson.loads(data)
                usage = chunk.get("usage")
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    tokens = usage["completion_tokens"]
                if any(_has_output(c) for c in chunk.get("choices") or ()):
                    last = time.perf_counter()
                    first = first or last
                    events += 1
    except (httpx.HTTPError, orjson.JSONDecodeError) as exc:
        return result(type(exc).__name__)
    if first is None or last is None:
        return result("no_output")
    itl = (last - first) * 1000 / (events - 1) if events > 1 else None
    return result(None, (first - started) * 1000, itl)


def _has_output(choice: Any) -> bool:
    delta = choice.get("delta") if isinstance(choice, dict) else None
    return isinstance(delta, dict) and any(
        delta.get(k) for k in ("content", "reasoning_content", "tool_calls")
    )


def run_probe(
    args: argparse.Namespace, config: GatewayConfig, chosen: Sequence[Target], out: Path, console: Console
) -> dict[str, Any]:
    """One probe of every chosen endpoint: results, table and files in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[ProbeResult]] = {t.endpoint.name: [] for t in chosen}
    total = len(chosen) * (args.requests + args.warmup)
    lines = (out / "requests.jsonl").open("ab")
    with (
        httpx.Client(timeout=httpx.Timeout(args.timeout_s)) as client,
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
        ) as progress,
    ):
        task = progress.add_task("probing", total=total)
        for target in chosen:
            for i in range(args.warmup + args.requests):
                warm = i < args.warmup
                progress.update(
                    task, description=f"{target.endpoint.name} {'warm-up' if warm else 'request'} {i + 1}"
                )
                result = probe_once(
                    client, target, i, warmup=warm, prompt=args.prompt, max_tokens=args.max_tokens
                )
                results[target.endpoint.name].append(result)
                lines.write(orjson.dumps(result.as_json()) + b"\n")
                progress.advance(task)
                if i < args.warmup + args.requests - 1:
                    time.sleep(args.interval_s)
    lines.close()
    summaries = [summarise(name, rs) for name, rs in results.items()]
    report = {
        "at": datetime.now(UTC).isoformat(),
        "method": {
            "requests": args.requests,
            "warmup": args.warmup,
            "interval_s": args.interval_s,
            "max_tokens": args.max_tokens,
            "prompt": args.prompt,
            "concurrency": 1,
            "temperature": 0,
        },
        "endpoints": summaries,
        "ranking": ranking(summaries),
        "warmup_requests": {name: [r.index for r in rs if r.warmup] for name, rs in results.items()},
        "by_hour_utc": {name: by_hour(rs) for name, rs in results.items()},
        "models": {t.endpoint.name: t.model for t in chosen},
    }
    (out / "probe.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    figures = plots(results, out)
    if args.html:
        write_html(report, figures, out / "probe.html")
    return report


def apply(url: str, admin_key: str, report: dict[str, Any], call: Callable[..., dict[str, Any]]) -> list[str]:
    """Send each model's serverless ranking to a running gateway (PUT /admin/models/{m}/probe)."""
    done = []
    per_model: dict[str, list[dict[str, Any]]] = {}
    for entry in report["ranking"]:
        per_model.setdefault(report["models"][entry["endpoint"]], []).append(entry)
    for model, entries in per_model.items():
        call("PUT", url, f"/admin/models/{model}/probe", admin_key, {"ranking": entries, "at": report["at"]})
        done.append(model)
    return done


def schedule(args: argparse.Namespace) -> tuple[float, float] | None:
    if args.every is None and args.for_ is None:
        return None
    if args.every is None or args.for_ is None:
        raise SystemExit("--every and --for go together, e.g. --every 1h --for 24h")
    return parse_window(args.every), parse_window(args.for_)


def check_args(args: argparse.Namespace) -> str | None:
    """Why the probe's arguments cannot be used, or None."""
    if not args.config:
        return "--config FILE is required (or --compare DIR1 DIR2)"
    if args.requests < 1 or args.warmup < 0 or args.interval_s < 0 or args.max_tokens < 1:
        return "--requests and --max-tokens must be >= 1, --warmup and --interval-s >= 0"
    return None


def refused(args: argparse.Namespace) -> int | None:
    """None to go on (--yes, or a person at a terminal said yes); else the exit status: 2
    when nobody can be asked (not a terminal, no --yes), 1 when the person said no."""
    if args.yes:
        return None
    if not sys.stdin.isatty():
        print("not a terminal: pass --yes to send these requests", file=sys.stderr)
        return 2
    return None if input("send them? [y/N] ").strip().lower() in ("y", "yes") else 1


def add_parser(commands: Any) -> None:
    probe = commands.add_parser(
        "probe", help="the field notes' TTFT consistency benchmark, per endpoint (calls them directly)"
    )
    probe.add_argument("--config", help="the gateway config whose endpoints to probe")
    probe.add_argument("--model", help="only this model's endpoints")
    probe.add_argument("--endpoint", action="append", default=[], help="only this endpoint (repeatable)")
    probe.add_argument("--requests", type=int, default=75, help="measured requests per endpoint (default 75)")
    probe.add_argument("--warmup", type=int, default=3, help="first requests, not counted (default 3)")
    probe.add_argument("--interval-s", type=float, default=2.0, help="pause between requests (default 2)")
    probe.add_argument("--prompt", default=None, help="the fixed prompt (default: a short question)")
    probe.add_argument("--max-tokens", type=int, default=64)
    probe.add_argument("--timeout-s", type=float, default=120.0, help="per request")
    probe.add_argument("--out", type=Path, help="where results go (default probe-<UTC time>)")
    probe.add_argument("--html", action="store_true", help="also write probe.html")
    probe.add_argument("--yes", action="store_true", help="do not ask before sending")
    probe.add_argument("--every", help="repeat the probe this often, e.g. 1h (with --for)")
    probe.add_argument("--for", dest="for_", help="... for this long, e.g. 24h")
    probe.add_argument("--apply", metavar="URL", help="send the ranking to a running gateway (admin API)")
    add_options(probe, [admin_key_option("for --apply")])
    probe.add_argument("--compare", nargs=2, type=Path, metavar="DIR", help="compare two probe runs")
    probe.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    console = Console()
    if not console.is_terminal:  # piped or captured: keep the table whole
        console = Console(width=200)
    if args.compare:
        console.print(compare(*args.compare))
        return 0
    problem = check_args(args)
    if problem is not None:
        print(f"tidegate probe: {problem}", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"{args.config}: {exc}", file=sys.stderr)
        return 2
    args.prompt = args.prompt or DEFAULT_PROMPT
    chosen = targets(config, args.model, args.endpoint)
    every = schedule(args)
    runs = 1 if every is None else max(1, int(every[1] // every[0]))
    console.print(
        f"probe plan: {runs} run(s), each {args.warmup} warm-up + {args.requests} requests per endpoint, "
        f"one at a time, {args.interval_s:g}s apart, max_tokens {args.max_tokens}:"
    )
    planned = (args.requests + args.warmup) * runs
    for name, line in estimate(chosen, planned, args.prompt, args.max_tokens):
        console.print(f"  {name}: {line}")
    status = refused(args)
    if status is not None:
        return status
    out = args.out or Path(f"probe-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    for run_index in range(runs):
        started = time.monotonic()
        target = out if every is None else out / time.strftime("run-%Y%m%d-%H%M%S", time.gmtime())
        found = run_probe(args, config, chosen, target, console)
        console.print(table(found))
        for entry in found["ranking"]:
            if entry["caution"]:
                console.print(f"  {entry['endpoint']}: {entry['caution']}")
        console.print(f"results: {target}")
        if args.apply and not _apply_probe(args, found, console):
            return 1
        if every is not None:
            console.print(hours_table(out) or "")  # every run so far: peak against off-peak
        if every is not None and run_index < runs - 1:
            time.sleep(max(0.0, every[0] - (time.monotonic() - started)))
    return 0


def _apply_probe(args: argparse.Namespace, found: dict[str, Any], console: Console) -> bool:
    try:
        models = apply(args.apply, args.admin_key, found, call_admin)
    except AdminCallFailed as exc:
        print(f"--apply: {exc}", file=sys.stderr)
        return False
    console.print(f"applied the ranking to {args.apply} for {', '.join(models)}")
    return True
