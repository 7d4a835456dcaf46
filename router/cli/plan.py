"""`tidegate plan`: how many dedicated replicas, and which routing settings, minimise the cost
per SLO-successful task for this traffic, before paying for any of it.

Every plan of a grid (replicas x max_concurrency x max_queue_ms x canary percent) runs through
the discrete-event model (router/offline/planner/model.py) over the trace; the table shows each plan's
cost, cost per SLO-successful task, SLO attainment, TTFT p95, dedicated utilization and spill
share; the cheapest plan meeting the SLO is marked and the runner-up's loss explained.
`--price-sweep` adds the GPU-hour price (and serverless price multiple) at which each plan would
beat all-serverless. Writes plan.json and pareto.png (cost against attainment) to `--out`.

The model starts from a named calibration (router/offline/calibration.py); every figure can be
overridden by a flag, read from a gateway config (`--config`, prices and capacity), fitted
from a running gateway's route figures (`--calibrate URL`) or, for serverless TTFT, from a
`tidegate probe` result (`--probe-result`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from router.cli.admin_client import AdminCallFailed, call_admin
from router.config import ConfigError, DedicatedEndpoint, ServerlessEndpoint, load_config
from router.offline import calibration
from router.offline.calibration import (
    SERVERLESS_PRESETS,
    DedicatedCalibration,
    ServerlessCalibration,
    TtftDistribution,
)
from router.offline.planner.model import System
from router.offline.planner.sweep import Grid, break_even, choose, pareto, sweep
from router.offline.replay import load, scale_rate, window

Z95 = 1.6449  # the standard normal's 95th percentile: a log-normal's p95 / p50 = exp(Z95 x sigma)


def ttft_from_quantiles(p50_ms: float, p95_ms: float, cold_range_s: tuple[float, float]) -> TtftDistribution:
    """A log-normal TTFT with the measured median and p95 (a probe's or a route's figures)."""
    if p50_ms <= 0 or p95_ms < p50_ms:
        raise ValueError(f"TTFT p50 {p50_ms} ms and p95 {p95_ms} ms cannot describe a distribution")
    return TtftDistribution(p50_ms / 1000, math.log(p95_ms / p50_ms) / Z95, cold_range_s=cold_range_s)


def _dedicated(args: argparse.Namespace, config_endpoint: DedicatedEndpoint | None) -> DedicatedCalibration:
    d = calibration.DEDICATED[args.calibration]
    if config_endpoint is not None and config_endpoint.gpu_hour_usd > 0:
        d = dataclasses.replace(d, gpus=config_endpoint.gpus, gpu_hour_usd=config_endpoint.gpu_hour_usd)
    given = {
        "prefill_tokens_per_s": args.prefill_tokens_per_s,
        "itl_s": None if args.itl_ms is None else args.itl_ms / 1000,
        "itl_per_seq_s": None if args.itl_per_seq_ms is None else args.itl_per_seq_ms / 1000,
        "decode_tokens_per_s": args.decode_tokens_per_s,
        "overhead_s": None if args.overhead_ms is None else args.overhead_ms / 1000,
        "max_num_seqs": args.max_num_seqs,
        "gpus": args.gpus,
        "gpu_hour_usd": args.gpu_hour_usd,
    }
    return dataclasses.replace(d, **{k: v for k, v in given.items() if v is not None})


def _serverless(
    args: argparse.Namespace, config_endpoint: ServerlessEndpoint | None
) -> ServerlessCalibration:
    s = calibration.SERVERLESS[args.serverless]
    if config_endpoint is not None and (config_endpoint.usd_per_mtok_in or config_endpoint.usd_per_mtok_out):
        s = dataclasses.replace(
            s,
            usd_per_mtok_in=config_endpoint.usd_per_mtok_in,
            usd_per_mtok_out=config_endpoint.usd_per_mtok_out,
        )
    cold = tuple(args.cold_s) if args.cold_s is not None else s.ttft.cold_range_s
    ttft = s.ttft
    if args.serverless_preset is not None:
        ttft = SERVERLESS_PRESETS[args.serverless_preset]
    if args.probe_result is not None:
        ttft = _probe_ttft(args.probe_result, args.probe_endpoint, (cold[0], cold[1]))
    given = {
        "idle_to_cold_s": args.idle_to_cold_s,
        "usd_per_mtok_in": args.usd_per_mtok_in,
        "usd_per_mtok_out": args.usd_per_mtok_out,
        "itl_s": None if args.serverless_itl_ms is None else args.serverless_itl_ms / 1000,
    }
    s = dataclasses.replace(s, ttft=dataclasses.replace(ttft, cold_range_s=(cold[0], cold[1])))
    return dataclasses.replace(s, **{k: v for k, v in given.items() if v is not None})


def _probe_ttft(path: Path, endpoint: str | None, cold: tuple[float, float]) -> TtftDistribution:
    """The serverless TTFT from `tidegate probe --out`'s probe.json (one endpoint's figures)."""
    found = orjson.loads(path.read_bytes())
    rows = [r for r in found.get("endpoints", []) if endpoint is None or r.get("endpoint") == endpoint]
    rows = [r for r in rows if isinstance(r.get("ttft_ms"), dict)]
    if len(rows) != 1:
        names = ", ".join(str(r.get("endpoint")) for r in found.get("endpoints", []))
        raise ValueError(f"{path}: name one endpoint with --probe-endpoint (measured: {names or 'none'})")
    ttft = rows[0]["ttft_ms"]
    return ttft_from_quantiles(float(ttft["median"]), float(ttft["p95"]), cold)


def calibrate(
    url: str, admin_key: str, model: str, d: DedicatedCalibration, s: ServerlessCalibration
) -> tuple[DedicatedCalibration, ServerlessCalibration, list[str]]:
    """Fit the model to a running gateway's route figures (GET /admin/routes): the dedicated
    route's prefill rate from its median TTFT and mean prompt (the fixed overhead kept), its
    decode step from its median ITL, and the serverless route's TTFT from its p50 and p95.
    The figures are medians over the window: fit on a window of light load, where the TTFT is
    prefill and not a queue."""
    report = call_admin("GET", url, "/admin/routes?window=1h", admin_key, timeout=30)
    routes = (report.get("models") or {}).get(model, {}).get("routes") or {}
    notes: list[str] = []
    for name, route in routes.items():
        ttft = route.get("ttft_ms") or {}
        requests = route.get("requests") or 0
        if not ttft or not requests:
            continue
        if route.get("kind") == "dedicated":
            prompt = route.get("tokens_in", 0) / requests
            prefill_s = ttft["p50"] / 1000 - d.overhead_s
            if prompt > 0 and prefill_s > 0:
                d = dataclasses.replace(d, prefill_tokens_per_s=prompt / prefill_s)
                notes.append(
                    f"{name}: prefill {d.prefill_tokens_per_s:,.0f} tokens/s ({prompt:.0f}-token prompts)"
                )
            if route.get("itl_p50_ms"):
                d = dataclasses.replace(d, itl_s=route["itl_p50_ms"] / 1000)
                notes.append(f"{name}: decode step {route['itl_p50_ms']:.1f} ms")
        elif ttft.get("p95", 0) >= ttft.get("p50", 0) > 0:
            fitted = ttft_from_quantiles(ttft["p50"], ttft["p95"], s.ttft.cold_range_s)
            s = dataclasses.replace(s, ttft=fitted)
            notes.append(f"{name}: TTFT p50 {ttft['p50']:.0f} ms, p95 {ttft['p95']:.0f} ms")
    if not notes:
        raise ValueError(f"{url} has no route figures for model {model!r} in the last hour")
    return d, s, notes


def _grid(args: argparse.Namespace) -> Grid:
    return Grid(
        replicas=args.replicas,
        max_concurrency=args.max_concurrency,
        max_queue_ms=args.max_queue_ms,
        canary_percent=args.canary,
        ttft_budget_ms=args.ttft_budget_ms,
        keep_warm_s=args.keep_warm_s,
    )


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    try:
        dedicated_endpoint, serverless_endpoint, window_s, max_waiters = _from_config(args)
        d = _dedicated(args, dedicated_endpoint)
        s = _serverless(args, serverless_endpoint)
        if args.calibrate:
            d, s, notes = calibrate(args.calibrate, args.admin_key, args.model, d, s)
            console.print("calibrated from " + args.calibrate + ": " + "; ".join(notes))
        rows = window(load(Path(args.trace), args.format), args.start, args.minutes)
        rows = scale_rate(rows, args.scale_rate, seed=args.seed)
    except (OSError, ValueError, KeyError, ConfigError, AdminCallFailed) as exc:
        print(f"tidegate plan: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print("tidegate plan: no rows in that window", file=sys.stderr)
        return 2
    if args.price_sweep and 0 not in args.replicas:
        message = "--price-sweep compares with all-serverless: keep 0 in --replicas"
        print(f"tidegate plan: {message}", file=sys.stderr)
        return 2
    span_s = (args.minutes * 60) if args.minutes is not None else rows[-1].at_s
    system = System(d, s, window_s=window_s, max_waiters=max_waiters)
    plans = _grid(args).plans()
    started = time.perf_counter()
    with Progress(
        TextColumn("modelling plans"), BarColumn(), MofNCompleteColumn(), console=console, transient=True
    ) as progress:
        bar = progress.add_task("plans", total=len(plans))
        results = sweep(
            rows,
            plans,
            system,
            slo_ttft_ms=args.slo_ttft_ms,
            span_s=span_s,
            progress=lambda: progress.advance(bar),
        )
    elapsed = time.perf_counter() - started
    verdict = choose(results, args.target)
    front = pareto(results)
    baseline = next((r for r in results if r["settings"]["replicas"] == 0), None)
    if args.price_sweep and baseline is not None:
        for r in results:
            r["break_even"] = break_even(r, baseline, system)
    found = {
        "trace": {
            "path": str(args.trace),
            "start_min": args.start,
            "minutes": args.minutes,
            "scale_rate": args.scale_rate,
            "requests": len(rows),
            "span_s": span_s,
        },
        "slo": {"ttft_ms": args.slo_ttft_ms, "target_attainment": args.target},
        "dedicated": dataclasses.asdict(d),
        "serverless": dataclasses.asdict(s),
        "plans": results,
        "pareto": front,
        "model_seconds": round(elapsed, 3),
    } | verdict
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plan.json").write_bytes(
        orjson.dumps(found, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    )
    Console(width=None if os.isatty(1) else 200).print(_table(results, verdict, front, args))
    plot_note = _plot(found, args.out / "pareto.png")
    print(
        f"{len(results)} plans of {len(rows)} requests modelled in {elapsed:.1f}s "
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


def _usd(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"${value:,.{digits}f}"


def _table(
    results: list[dict[str, Any]], verdict: dict[str, Any], front: list[str], args: argparse.Namespace
) -> Table:
    table = Table(title=f"plans: SLO TTFT <= {args.slo_ttft_ms:g} ms for {args.target:.0%} of requests")
    for column in ("plan", "cost", "per SLO success", "SLO met", "TTFT p95 ms", "ded. util", "spill"):
        table.add_column(column, justify="left" if column == "plan" else "right")
    if args.price_sweep:
        table.add_column("wins below $/GPU-h", justify="right")
        table.add_column("or serverless price x", justify="right")
    ordered = sorted(results, key=lambda r: r.get("cost_per_slo_success_usd") or math.inf)
    shown = ordered if args.show_all else ordered[: args.top]
    for r in shown:
        marks = ("* " if r["plan"] == verdict["chosen"] else "") + ("(pareto) " if r["plan"] in front else "")
        util = r.get("dedicated_utilization")
        row = [
            marks + r["plan"],
            _usd(r["cost_usd"]),
            _usd(r.get("cost_per_slo_success_usd"), 5),
            f"{r['slo_attainment']:.1%}",
            f"{r['ttft_ms']['p95']:,.0f}",
            "-" if util is None else f"{util:.0%}",
            f"{r['spill_share']:.0%}",
        ]
        if args.price_sweep:
            be = r.get("break_even") or {}
            row.append(_usd(be.get("gpu_hour_usd")))
            row.append("-" if be.get("serverless_price_x") is None else f"{be['serverless_price_x']:.2f}x")
        table.add_row(*row)
    if len(shown) < len(results):
        table.caption = (
            f"the {len(shown)} cheapest of {len(results)} plans per SLO success (--show-all for all)"
        )
    return table


def _plot(found: dict[str, Any], path: Path) -> str:
    try:
        import matplotlib  # noqa: PLC0415 (optional: the `report` extra)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return "no pareto.png: the plot needs matplotlib (pip install 'tidegate[report]')"
    plans = [p for p in found["plans"] if p.get("cost_per_slo_success_usd") is not None]
    front = set(found["pareto"])
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.scatter(
        [p["cost_per_slo_success_usd"] * 1000 for p in plans],
        [p["slo_attainment"] * 100 for p in plans],
        color="#bbbbbb",
        s=14,
        label="plan",
    )
    edge = sorted((p for p in plans if p["plan"] in front), key=lambda p: p["cost_per_slo_success_usd"])
    ax.plot(
        [p["cost_per_slo_success_usd"] * 1000 for p in edge],
        [p["slo_attainment"] * 100 for p in edge],
        marker="o",
        color="#1f77b4",
        label="Pareto front",
    )
    for p in edge:
        ax.annotate(p["plan"], (p["cost_per_slo_success_usd"] * 1000, p["slo_attainment"] * 100), fontsize=7)
    chosen = next((p for p in plans if p["plan"] == found.get("chosen")), None)
    if chosen is not None:
        ax.scatter(
            [chosen["cost_per_slo_success_usd"] * 1000],
            [chosen["slo_attainment"] * 100],
            marker="*",
            s=220,
            color="#d62728",
            label="chosen",
            zorder=3,
        )
    ax.axhline(found["slo"]["target_attainment"] * 100, color="#999999", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    plain = matplotlib.ticker.FormatStrFormatter("%g")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.set_xlabel("cost per SLO-successful task (USD per 1,000 tasks)")
    ax.set_ylabel(f"SLO attainment (% of requests, TTFT <= {found['slo']['ttft_ms']:g} ms)")
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"Pareto plot: {path}"


def add_parser(commands: Any) -> None:
    plan = commands.add_parser(
        "plan",
        help="model dedicated-replica and routing plans over a trace; pick the cheapest meeting the SLO",
    )
    plan.add_argument("trace", help="Azure CSV, Mooncake JSONL or a tidegate access log")
    plan.add_argument("--format", choices=("azure", "mooncake", "access-log"), help="default: detected")
    plan.add_argument("--start", type=float, default=0.0, help="trace minute to start at")
    plan.add_argument("--minutes", type=float, default=None, help="how many trace minutes (default: all)")
    plan.add_argument("--scale-rate", type=float, default=1.0, help="multiply the arrival rate")
    plan.add_argument("--seed", type=int, default=0)
    plan.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    plan.add_argument(
        "--target", type=float, default=0.95, help="share of requests within the SLO a plan must meet (0-1)"
    )
    grid = Grid()
    plan.add_argument(
        "--replicas", type=int, nargs="+", default=list(grid.replicas), help="dedicated replicas"
    )
    plan.add_argument("--max-concurrency", type=int, nargs="+", default=list(grid.max_concurrency))
    plan.add_argument("--max-queue-ms", type=float, nargs="+", default=list(grid.max_queue_ms))
    plan.add_argument("--canary", type=float, nargs="+", default=list(grid.canary_percent), help="percent")
    plan.add_argument(
        "--ttft-budget-ms",
        type=float,
        nargs="*",
        default=list(grid.ttft_budget_ms),
        help="also predicted-TTFT admission at these budgets (ceiling: the largest --max-concurrency)",
    )
    plan.add_argument(
        "--keep-warm-s",
        type=float,
        nargs="+",
        default=list(grid.keep_warm_s),
        help="serverless keep-warm intervals to try (0: off)",
    )
    plan.add_argument(
        "--price-sweep", action="store_true", help="the prices at which each plan beats all-serverless"
    )
    plan.add_argument("--out", type=Path, default=Path("plan"), help="directory for plan.json and pareto.png")
    plan.add_argument("--top", type=int, default=15, help="plans shown in the table")
    plan.add_argument("--show-all", action="store_true")
    source = plan.add_argument_group("the model's figures (a calibration, then a config, then flags)")
    source.add_argument("--calibration", choices=sorted(calibration.DEDICATED), default="deepseek-r1-h200")
    source.add_argument("--serverless", choices=sorted(calibration.SERVERLESS), default="deepseek-serverless")
    source.add_argument("--config", type=Path, help="a tidegate.yaml: its prices, GPUs and state.window_s")
    source.add_argument("--model", default="demo-model", help="the model of --config / --calibrate")
    source.add_argument(
        "--calibrate", metavar="URL", help="fit the model to a running gateway's route figures"
    )
    source.add_argument("--admin-key", default=os.environ.get("TIDEGATE_ADMIN_KEY", ""))
    source.add_argument(
        "--probe-result", type=Path, help="probe.json from tidegate probe: the serverless TTFT"
    )
    source.add_argument("--probe-endpoint", help="which endpoint of --probe-result")
    source.add_argument("--window-s", type=float, default=60.0, help="the gateway's latency window")
    source.add_argument("--prefill-tokens-per-s", type=float)
    source.add_argument("--itl-ms", type=float, help="decode step with an empty batch")
    source.add_argument("--itl-per-seq-ms", type=float, help="decode step growth per running sequence")
    source.add_argument("--decode-tokens-per-s", type=float)
    source.add_argument("--overhead-ms", type=float, help="fixed part of a dedicated TTFT")
    source.add_argument("--max-num-seqs", type=int, help="the engine's own ceiling per replica")
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
