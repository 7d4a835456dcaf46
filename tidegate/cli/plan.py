"""`tidegate plan`: how many dedicated replicas, and which routing settings, minimise the cost
per SLO-successful task for this traffic, before paying for any of it.

Every plan of a grid (replicas x max_concurrency x max_queue_ms x canary percent) runs through
the discrete-event model (tidegate/offline/planner/model.py) over the trace; the table shows each plan's
cost, cost per SLO-successful task, SLO attainment, TTFT p95, dedicated utilization and spill
share; the cheapest plan meeting the SLO is marked and the runner-up's loss explained.
`--price-sweep` adds the GPU-hour price (and serverless price multiple) at which each plan would
beat all-serverless. Writes plan.json and pareto.png (cost against attainment) to `--out`.

The model starts from a named calibration (tidegate/offline/calibration.py); every figure can be
overridden by a flag, read from a gateway config (`--config`, prices and capacity), fitted
from a running gateway's route figures (`--calibrate URL`) or, for serverless TTFT, from a
`tidegate probe` result (`--probe-result`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from router.cli.admin_client import AdminCallFailed, call_admin
from router.cli.options import add_options, admin_key_option, option
from router.config import ConfigError, DedicatedEndpoint, ServerlessEndpoint, load_config
from tidegate.cli import plan_sampling, plan_schedule
from tidegate.cli.plan_figures import dedicated_figures, serverless_figures
from tidegate.cli.plan_from import gateway_rows
from tidegate.cli.plan_output import pareto_plot, plan_table
from tidegate.offline import calibration
from tidegate.offline.calibration import (
    SERVERLESS_PRESETS,
    DedicatedCalibration,
    ServerlessCalibration,
)
from tidegate.offline.fitting import fit_to_routes
from tidegate.offline.planner.plans import System
from tidegate.offline.planner.sweep import Grid, break_even, choose, pareto
from tidegate.offline.replay import Arrival, load, scale_rate, window


def calibrate(
    url: str, admin_key: str, model: str, d: DedicatedCalibration, s: ServerlessCalibration
) -> tuple[DedicatedCalibration, ServerlessCalibration, list[str]]:
    """The model fitted to a running gateway's last hour of route figures (GET /admin/routes;
    tidegate/offline/fitting.py's `fit_to_routes`)."""
    report = call_admin("GET", url, "/admin/routes?window=1h", admin_key, timeout=30)
    routes = (report.get("models") or {}).get(model, {}).get("routes") or {}
    d, s, notes = fit_to_routes(routes, d, s)
    if not notes:
        raise ValueError(f"{url} has no route figures for model {model!r} in the last hour")
    return d, s, notes


def _budgets(slo_ms: float) -> list[float]:
    """The SLO, and budgets below it: a prediction reads the decode batch at admission, and
    prompts admitted after it lengthen every later step (docs/replay-and-plan.md)."""
    return [slo_ms, 0.75 * slo_ms]


def _grid(args: argparse.Namespace, ceiling: int) -> Grid:
    return Grid(
        replicas=args.replicas,
        max_concurrency=args.max_concurrency,
        max_queue_ms=args.max_queue_ms,
        canary_percent=args.canary,
        ttft_budget_ms=_budgets(args.slo_ttft_ms) if args.ttft_budget_ms is None else args.ttft_budget_ms,
        predicted_ceiling=ceiling,
        keep_warm_s=args.keep_warm_s,
    )


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    inputs = _inputs(args, console)
    if isinstance(inputs, str):
        print(f"tidegate plan: {inputs}", file=sys.stderr)
        return 2
    rows, system, d, s, gateway_start = inputs
    if args.schedule:
        return plan_schedule.run(args, rows, system, console, gateway_start)
    span_s = (args.minutes * 60) if args.minutes is not None else rows[-1].at_s
    plans = _grid(args, d.max_num_seqs).plans()
    started = time.perf_counter()
    results = plan_sampling.model(rows, plans, system, args, span_s=span_s, console=console)
    elapsed = time.perf_counter() - started
    verdict = choose(results, args.target)
    front = pareto(results)
    baseline = next((r for r in results if r["settings"]["replicas"] == 0), None)
    if args.price_sweep and baseline is not None:
        for r in results:
            r["break_even"] = break_even(r, baseline, system)
    trace = {
        "sampled": results[0].get("sampled") if results else None,
        "path": str(args.trace),
        "start_min": args.start,
        "minutes": args.minutes,
        "scale_rate": args.scale_rate,
        "requests": len(rows),
        "span_s": span_s,
    }
    found = {
        "trace": trace,
        "slo": {"ttft_ms": args.slo_ttft_ms, "target_attainment": args.target},
        "dedicated": dataclasses.asdict(d),
        "serverless": dataclasses.asdict(s),
        "prefix_hit_rate": args.prefix_hit_rate,  # modelled, not measured (--prefix-hit-rate)
        "plans": results,
        "pareto": front,
        "model_seconds": round(elapsed, 3),
    } | verdict
    return _write(found, args, len(rows), elapsed)


def _inputs(
    args: argparse.Namespace, console: Console
) -> tuple[list[Arrival], System, DedicatedCalibration, ServerlessCalibration, datetime | None] | str:
    """The trace's rows, the system to model and, with --from, when the gateway's first hour
    of traffic started; or what is wrong with the arguments."""
    start = None
    try:
        dedicated_endpoint, serverless_endpoint, window_s, max_waiters = _from_config(args)
        d = dedicated_figures(args, dedicated_endpoint)
        s = serverless_figures(args, serverless_endpoint)
        if args.calibrate:
            d, s, notes = calibrate(args.calibrate, args.admin_key, args.model, d, s)
            console.print("calibrated from " + args.calibrate + ": " + "; ".join(notes))
        if args.from_url:
            start, rows = gateway_rows(
                args.from_url,
                args.admin_key,
                args.model,
                args.window,
                load(Path(args.trace), args.format),
                seed=args.seed,
            )
        else:
            rows = window(load(Path(args.trace), args.format), args.start, args.minutes)
        rows = scale_rate(rows, args.scale_rate, seed=args.seed)
    except (OSError, ValueError, KeyError, ConfigError, AdminCallFailed) as exc:
        return str(exc)
    if not rows:
        return "no rows in that window"
    if args.price_sweep and 0 not in args.replicas:
        return "--price-sweep compares with all-serverless: keep 0 in --replicas"
    if args.slice_s <= 0 or args.slices_per_stratum < 1:
        return "--slice-s must be > 0 and --slices-per-stratum >= 1"
    problem = _system_problem(args)
    if problem:
        return problem
    batch = {"batch_share": args.batch_share, "batch_reserve": args.batch_reserve}
    system = System(
        d,
        s,
        window_s,
        max_waiters,
        batch_max_wait_s=args.batch_max_wait_s,
        prefix_hit_rate=args.prefix_hit_rate,
        **batch,
    )
    return rows, system, d, s, start


def _system_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the modelled system's options (batch traffic, the prefix cache)."""
    if not 0 <= args.batch_share <= 1 or args.batch_reserve < 0 or args.batch_max_wait_s <= 0:
        return "--batch-share must be from 0 to 1, --batch-reserve >= 0, --batch-max-wait-s > 0"
    if not 0 <= args.prefix_hit_rate < 1:
        return "--prefix-hit-rate must be from 0 to under 1"
    return None


def _write(found: dict[str, Any], args: argparse.Namespace, requests: int, elapsed: float) -> int:
    """plan.json, the table and the Pareto plot; 1 when no plan met the SLO."""
    results, verdict = found["plans"], {k: found[k] for k in ("chosen", "why")}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plan.json").write_bytes(
        orjson.dumps(found, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    )
    Console(width=None if os.isatty(1) else 200).print(plan_table(results, found, found["pareto"], args))
    plot_note = pareto_plot(found, args.out / "pareto.png")
    print(
        f"{len(results)} plans of {requests} requests modelled in {elapsed:.1f}s "
        f"({elapsed / len(results) * 1000:.0f} ms per plan)."
    )
    if verdict["chosen"] is None:
        print(verdict["why"])
    else:
        print(f"cheapest plan meeting the SLO: {verdict['chosen']}; {verdict['why']}.")
    print(f"results: {args.out / 'plan.json'}; {plot_note}")
    return 0 if verdict["chosen"] is not None else 1


def _from_config(
    args: argparse.Namespace,
) -> tuple[DedicatedEndpoint | None, ServerlessEndpoint | None, float, int]:
    if args.config is None:
        return None, None, args.window_s, 64
    config = load_config(args.config)
    model = config.models.get(args.model)
    if model is None:
        raise ValueError(f"--model {args.model}: not in {args.config} (models: {', '.join(config.models)})")
    dedicated = model.dedicated[0] if model.dedicated else None
    serverless = model.serverless[0] if model.serverless else None
    return dedicated, serverless, config.state.window_s, dedicated.max_waiters if dedicated else 64


_GRID = Grid()  # the default plans the options show
_OPTIONS = (
    option(
        "trace", help="Azure CSV, Mooncake JSONL or a tidegate access log (with --from: the in-hour shape)"
    ),
    option(
        "--from",
        dest="from_url",
        metavar="URL",
        help="plan over a running gateway's traffic: each hour's requests from its rollups "
        "(GET /admin/report, --admin-key, --model), each hour's sizes and bursts from TRACE",
    ),
    option("--window", default="7d", help="--from: how far back (within the gateway's state.retention_s)"),
    option("--format", choices=("azure", "mooncake", "access-log"), help="default: detected"),
    option("--start", type=float, default=0.0, help="trace minute to start at"),
    option("--minutes", type=float, default=None, help="how many trace minutes (default: all)"),
    option("--scale-rate", type=float, default=1.0, help="multiply the arrival rate"),
    option("--seed", type=int, default=0),
    option("--slo-ttft-ms", type=float, default=2000.0),
    option("--batch-share", type=float, default=0.0, help="of requests: batch traffic (docs/tenants.md)"),
    option("--batch-reserve", type=int, default=1, help="routing.batch.reserve_slots"),
    option("--batch-max-wait-s", type=float, default=300.0, help="routing.batch.max_wait_s"),
    option(
        "--prefix-hit-rate",
        type=float,
        default=0.0,
        help="share of dedicated prompt tokens a prefix cache holds",
    ),
    option(
        "--target", type=float, default=0.95, help="share of requests within the SLO a plan must meet (0-1)"
    ),
    option("--replicas", type=int, nargs="+", default=list(_GRID.replicas), help="dedicated replicas"),
    option("--max-concurrency", type=int, nargs="+", default=list(_GRID.max_concurrency)),
    option("--max-queue-ms", type=float, nargs="+", default=list(_GRID.max_queue_ms)),
    option("--canary", type=float, nargs="+", default=list(_GRID.canary_percent), help="percent"),
    option(
        "--ttft-budget-ms",
        type=float,
        nargs="*",
        default=None,
        help="also predicted-TTFT admission at these budgets (ceiling: the engine's max_num_seqs); "
        "default: the SLO and 3/4 of it; none: slots only",
    ),
    option(
        "--keep-warm-s",
        type=float,
        nargs="+",
        default=list(_GRID.keep_warm_s),
        help="serverless keep-warm intervals to try (0: off)",
    ),
    option("--price-sweep", action="store_true", help="the prices at which each plan beats all-serverless"),
    option(
        "--schedule",
        action="store_true",
        help="a replica count per hour of the week (from --replicas, best of --max-concurrency), "
        "written as the endpoint's schedule",
    ),
    option(
        "--provision-s",
        type=float,
        default=300.0,
        help="--schedule: a replica added is paid this long before it serves (loading)",
    ),
    option(
        "--warm-floor",
        type=int,
        default=0,
        help="--schedule: keep at least this many replicas every hour (otherwise an hour keeps a "
        "replica only where it costs less than serverless meeting the SLO)",
    ),
    option(
        "--trace-start",
        help="--schedule: the first row's UTC date and time (default: an Azure CSV's first timestamp)",
    ),
    option("--out", type=Path, default=Path("plan"), help="directory for plan.json and pareto.png"),
    option(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="processes modelling plans (or hours) at once; the figures do not depend on it "
        "(default: every core)",
    ),
    *plan_sampling.OPTIONS,
    option("--top", type=int, default=15, help="plans shown in the table"),
    option("--show-all", action="store_true"),
)


def add_parser(commands: Any) -> None:
    plan = commands.add_parser(
        "plan",
        help="model dedicated-replica and routing plans over a trace; pick the cheapest meeting the SLO",
    )
    add_options(plan, _OPTIONS)
    source = plan.add_argument_group("the model's figures (a calibration, then a config, then flags)")
    source.add_argument("--calibration", choices=sorted(calibration.DEDICATED), default="deepseek-r1-h200")
    source.add_argument(
        "--serverless",
        choices=sorted(calibration.SERVERLESS),
        help="default: the calibration's partner (the same model's API, tidegate/offline/calibration.py)",
    )
    source.add_argument("--config", type=Path, help="a tidegate.yaml: its prices, GPUs and state.window_s")
    source.add_argument("--model", default="demo-model", help="the model of --config / --calibrate")
    source.add_argument(
        "--calibrate", metavar="URL", help="fit the model to a running gateway's route figures"
    )
    add_options(source, [admin_key_option("for --calibrate and --from")])
    source.add_argument(
        "--probe-result", type=Path, help="probe.json from tidegate probe: the serverless TTFT"
    )
    source.add_argument("--probe-endpoint", help="which endpoint of --probe-result")
    source.add_argument("--window-s", type=float, default=60.0, help="the gateway's latency window")
    source.add_argument(
        "--prefill-tokens-per-s", type=float, help="marginal: each prompt token adds 1/this to its step"
    )
    source.add_argument("--itl-ms", type=float, help="decode step with an empty batch")
    source.add_argument("--itl-per-seq-ms", type=float, help="decode step growth per decoding sequence")
    source.add_argument("--decode-tokens-per-s", type=float, help="aggregate decode ceiling (default: none)")
    source.add_argument("--overhead-ms", type=float, help="fixed part of a dedicated TTFT")
    source.add_argument("--max-num-seqs", type=int, help="the engine's own ceiling per replica (vLLM: 1024)")
    source.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help="tokens one step carries, prompt chunks included (vLLM: 8192)",
    )
    source.add_argument("--kv-capacity-tokens", type=float, help="the KV cache per replica, in tokens")
    source.add_argument("--gpus", type=int, help="GPUs per replica")
    source.add_argument("--gpu-hour-usd", type=float)
    source.add_argument(
        "--serverless-preset", choices=sorted(SERVERLESS_PRESETS), help="serverless TTFT shape"
    )
    source.add_argument("--serverless-itl-ms", type=float)
    source.add_argument("--idle-to-cold-s", type=float, help="serverless scale-to-zero after this idle gap")
    source.add_argument(
        "--cold-s", type=float, nargs=2, metavar=("MIN", "MAX"), help="a cold load's duration"
    )
    source.add_argument("--usd-per-mtok-in", type=float)
    source.add_argument("--usd-per-mtok-out", type=float)
    plan.set_defaults(run=run)
