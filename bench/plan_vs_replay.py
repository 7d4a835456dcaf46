"""Model against measurement: `tidegate plan`'s prediction of a plan next to `tidegate replay`'s
measurement of the same plan through a real `tidegate serve` in front of `tidegate sim`
processes, on the same trace slice.

Per plan it starts one dedicated simulator per replica (calibration `deepseek-r1-h200`) and one
scale-to-zero serverless simulator (`deepseek-serverless`), all at `--time-scale K`; writes the
plan's gateway config (routes named as the model names them), time-lapses it by K (the same
code as `tidegate replay --scale-config`), serves it, and replays the slice at `--speed K`
through `tidegate replay --config`. Then it runs the model on the same rows and prints both:
SLO attainment (points apart), cost (% apart), p95 TTFT (% apart), spill share, utilization.

    python -m bench.plan_vs_replay [--slice code|conv ...] [--speed 4] [--plans LABEL ...]
                                   [--minutes 20] [--out DIR]

It also reports, per slice, the plan the model would choose among the replayed plans and how
its replayed cost per SLO-successful task compares with the best replayed plan's.

Speed: every wall-clock delay in the gateway, the simulators or the sender is multiplied by K in
trace time, so K is bounded by the machine: on 2 cores, K=10 put the code slice's bursts
(~90 requests/s) past what the three processes could serve without queueing of their own,
and K=4 did not.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from router.economics.cost import token_cost_usd
from tests.servers import CliProcess  # the suite's own `tidegate ...` process helper
from tidegate.offline.calibration import DEDICATED, PARTNERS, SERVERLESS, DedicatedCalibration
from tidegate.offline.planner.plans import SERVERLESS_ROUTE, Plan, System, dedicated_route
from tidegate.offline.planner.sweep import KEEP_WARM_PROMPT_TOKENS, choose, evaluate
from tidegate.offline.replay import AZURE_COLUMNS, azure_row, load, window
from tidegate.offline.timelapse import scale_config

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "traces"  # the Azure LLM inference traces (2023), in full
SLICES = {  # name -> (trace file, start minute); the two held-out slices
    "code": ("AzureLLMInferenceTrace_code.csv", 0.0),
    "conv": ("AzureLLMInferenceTrace_conv.csv", 31.0),
}
MODEL = "trace-model"
WINDOW_S = 100.0  # the gateway's latency window in trace seconds (10 s, its floor, at x10)
SLO_TTFT_MS = 2000.0
GATEWAY_S = 0.002  # the gateway's own wall time per request, scaled with the replay


@dataclass(frozen=True, slots=True)
class Pair:
    """The calibrations the simulators run and the model uses (tidegate/offline/calibration.py)."""

    dedicated: str = "deepseek-r1-h200"
    serverless: str = "deepseek-serverless"
    gpu_hour_usd: float | None = None  # the dedicated calibration's own price unless set

    @property
    def dedicated_calibration(self) -> DedicatedCalibration:
        d = DEDICATED[self.dedicated]
        return d if self.gpu_hour_usd is None else dataclasses.replace(d, gpu_hour_usd=self.gpu_hour_usd)


DEEPSEEK = Pair()


@dataclass(frozen=True, slots=True)
class Comparison:
    slice: str
    plan: Plan
    predicted: dict[str, Any]
    measured: dict[str, Any]

    @property
    def attainment_points(self) -> float:
        return 100 * (float(self.predicted["slo_attainment"]) - float(self.measured["slo_attainment"]))

    @property
    def cost_ratio(self) -> float:
        return float(self.predicted["cost_usd"]) / float(self.measured["cost_usd"]) - 1

    @property
    def p95_ratio(self) -> float:
        return float(self.predicted["ttft_ms"]["p95"]) / float(self.measured["ttft_ms"]["p95"]) - 1


def gateway_config(
    plan: Plan, dedicated_urls: Sequence[str], serverless_url: str, pair: Pair = DEEPSEEK
) -> str:
    """The plan as a tidegate config, in trace time, routes named as the model names them."""
    d = pair.dedicated_calibration
    s = SERVERLESS[pair.serverless]
    priors = f", prefill_tokens_per_s: {d.prefill_tokens_per_s:g}, ttft_overhead_ms: {d.overhead_s * 1000:g}"
    dedicated = "".join(
        f"      - {{name: {dedicated_route(i)}, base_url: '{url}', model: m, "
        f"max_concurrency: {plan.max_concurrency}, gpus: {d.gpus}, gpu_hour_usd: {d.gpu_hour_usd}"
        f"{priors if plan.ttft_budget_ms is not None else ''}}}\n"
        for i, url in enumerate(dedicated_urls)
    )
    if plan.ttft_budget_ms is not None:
        routing = "{admission: predicted_ttft}"
        slo = f"    slo: {{ttft_budget_ms: {plan.ttft_budget_ms:g}}}\n"
    else:
        routing, slo = f"{{max_queue_ms: {plan.max_queue_ms:g}}}", ""
    warm = (
        f", keep_warm: {{interval_s: {plan.keep_warm_s:g}, max_usd_per_day: 100}}" if plan.keep_warm_s else ""
    )
    return (
        "auth: {allow_anonymous: true}\n"
        f"state: {{window_s: {WINDOW_S:g}}}\n"
        "models:\n"
        f"  {MODEL}:\n"
        f"    canary_percent: {plan.canary_percent:g}\n"
        f"    routing: {routing}\n"
        + slo
        + (f"    dedicated:\n{dedicated}" if dedicated else "")
        + "    serverless:\n"
        f"      - {{name: {SERVERLESS_ROUTE}, base_url: '{serverless_url}', model: m, "
        f"usd_per_mtok_in: {s.usd_per_mtok_in}, usd_per_mtok_out: {s.usd_per_mtok_out}{warm}}}\n"
    )


@contextmanager
def system_under_test(
    plan: Plan, speed: float, workdir: Path, seed: int, pair: Pair = DEEPSEEK
) -> Iterator[tuple[str, Path, str]]:
    """Simulators and a time-lapsed gateway for `plan`; yields the gateway URL, its
    trace-time config (what the replay prices with) and the serverless simulator's URL."""
    common = ("--time-scale", f"{speed:g}", "--port", "0", "--tokens-per-write", "8")
    with ExitStack() as stack:
        dedicated = [
            stack.enter_context(
                CliProcess(
                    "sim",
                    "--profile",
                    "dedicated",
                    "--calibration",
                    pair.dedicated,
                    "--seed",
                    str(seed + i),
                    *common,
                )
            )
            for i in range(plan.replicas)
        ]
        serverless = stack.enter_context(
            CliProcess(
                "sim",
                "--profile",
                "serverless",
                "--calibration",
                pair.serverless,
                "--seed",
                str(seed + 100),
                *common,
            )
        )
        config = workdir / "gateway.yaml"
        config.write_text(gateway_config(plan, [p.url for p in dedicated], serverless.url, pair))
        scaled = workdir / f"gateway.x{speed:g}.yaml"
        scaled.write_text(scale_config(config.read_text(), speed, os.environ))
        gateway = stack.enter_context(
            CliProcess("--log-level", "warning", "serve", "--config", str(scaled), "--port", "0")
        )
        yield gateway.url, config, serverless.url


def model_system(speed: float, pair: Pair = DEEPSEEK) -> System:
    return System(
        pair.dedicated_calibration,
        SERVERLESS[pair.serverless],
        window_s=WINDOW_S,
        gateway_overhead_s=GATEWAY_S * speed,
    )


@dataclass(frozen=True, slots=True)
class Slice:
    """Which rows of which trace: `minutes` from minute `start`."""

    name: str
    trace: Path
    start: float
    minutes: float


def replay_plan(
    part: Slice, plan: Plan, speed: float, workdir: Path, pair: Pair = DEEPSEEK
) -> dict[str, Any]:
    """The plan measured: `tidegate replay` through the real system."""
    workdir.mkdir(parents=True, exist_ok=True)
    with system_under_test(plan, speed, workdir, 7, pair) as (url, config, serverless_url):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tidegate",
                "replay",
                str(part.trace),
                "--url",
                url,
                "--model",
                MODEL,
                "--config",
                str(config),
                "--start",
                f"{part.start:g}",
                "--minutes",
                f"{part.minutes:g}",
                "--speed",
                f"{speed:g}",
                "--slo-ttft-ms",
                f"{SLO_TTFT_MS:g}",
                "--out",
                str(workdir / "replay"),
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=part.minutes * 60 / speed + 300,
        )
        served = httpx.get(serverless_url.removesuffix("/v1") + "/sim/stats", timeout=10).json()["requests"]
    if done.returncode not in (0, 3):
        raise RuntimeError(
            f"replay of {part.name} {plan.label} failed:\n{done.stdout}\n{done.stderr[-2000:]}"
        )
    found: dict[str, Any] = orjson.loads((workdir / "replay" / "replay.json").read_bytes())
    if plan.keep_warm_s:  # the keep-warm pings the simulator served beyond the replayed rows: spend
        s = SERVERLESS[pair.serverless]
        probes = served - found["routes"].get(SERVERLESS_ROUTE, 0)
        spend = probes * token_cost_usd(KEEP_WARM_PROMPT_TOKENS, 1, s.usd_per_mtok_in, s.usd_per_mtok_out)
        successes = found["slo_attainment"] * found["requests"]
        found |= {"keep_warm_pings": probes, "keep_warm_usd": round(spend, 6)}
        found["cost_usd"] = round(found["cost_usd"] + spend, 6)
        found["cost_per_slo_success_usd"] = round(found["cost_usd"] / successes, 8) if successes else None
    return found


def compare(part: Slice, plan: Plan, speed: float, workdir: Path, pair: Pair = DEEPSEEK) -> Comparison:
    rows = window(load(part.trace), part.start, part.minutes)
    system = model_system(speed, pair)
    predicted = evaluate(rows, plan, system, slo_ttft_ms=SLO_TTFT_MS, span_s=part.minutes * 60)
    measured = replay_plan(part, plan, speed, workdir, pair)
    return Comparison(part.name, plan, predicted, measured)


def superpose(trace: Path, starts: Sequence[float], minutes: float, out: Path) -> Path:
    """Disjoint windows of one trace laid over each other from time 0, written as an Azure CSV:
    more traffic with independent bursts, not copies of the same requests at once."""
    ends = sorted((start, start + minutes) for start in starts)
    if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(ends)):
        raise SystemExit(f"--superpose: windows of {minutes:g} minutes from {list(starts)} overlap")
    whole = load(trace)
    rows = sorted((a for start in starts for a in window(whole, start, minutes)), key=lambda a: a.at_s)
    origin = datetime(2023, 11, 16)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(AZURE_COLUMNS)
        writer.writerows(azure_row(origin, a) for a in rows)
    return out


def parse_plan(label: str) -> Plan:
    """`0` (all-serverless) or `R:C:Q:P` (replicas, max_concurrency, max_queue_ms, canary %),
    or `R:C:pB` (predicted-TTFT admission, budget B ms, ceiling C); `+wS` adds keep-warm every
    S seconds (e.g. `1:256:p2000+w30`)."""
    label, _, warm = label.partition("+w")
    keep_warm_s = float(warm) if warm else 0.0
    if ":p" in label:
        replicas, ceiling, budget = label.replace("p", "").split(":")
        return Plan(int(replicas), int(ceiling), ttft_budget_ms=float(budget), keep_warm_s=keep_warm_s)
    parts = [float(x) for x in label.split(":")]
    if len(parts) == 1:
        return Plan(int(parts[0]), keep_warm_s=keep_warm_s)
    count, concurrency, queue, canary = ([*parts, 0.0, 100.0])[:4] if len(parts) == 2 else parts
    return Plan(int(count), int(concurrency), queue, canary, keep_warm_s=keep_warm_s)


DEFAULT_PLANS = ("0", "1:16:0:100", "1:64:0:100", "1:32:1000:100")


def _row(c: Comparison) -> str:
    p, m = c.predicted, c.measured
    valid = "" if m.get("client_kept_up") else "  INVALID (sender fell behind)"
    return (
        f"| {c.slice} | {c.plan.label} | {p['slo_attainment']:.1%} / {m['slo_attainment']:.1%} "
        f"({c.attainment_points:+.1f} pt) | ${p['cost_usd']:.3f} / ${m['cost_usd']:.3f} ({c.cost_ratio:+.1%}) "
        f"| {p['ttft_ms']['p95']:,.0f} / {m['ttft_ms']['p95']:,.0f} ms ({c.p95_ratio:+.1%}) "
        f"| {p['spill_share']:.0%} / {m['spill_share']:.0%} |{valid}"
    )


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slice", nargs="+", choices=sorted(SLICES), default=sorted(SLICES))
    parser.add_argument("--plans", nargs="+", default=list(DEFAULT_PLANS), help="0 or R:C:Q:P")
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--speed", type=float, default=4.0)
    parser.add_argument("--traces", type=Path, default=TRACES, help="directory with the Azure traces")
    parser.add_argument(
        "--trace", type=Path, help="replay this file instead of the slices (e.g. a tidegate trace synth week)"
    )
    parser.add_argument("--start", type=float, default=0.0, help="--trace: the minute to start at")
    parser.add_argument(
        "--superpose",
        nargs="+",
        type=float,
        metavar="MINUTE",
        help="with --trace: replay these disjoint --minutes windows of it laid over each other",
    )
    parser.add_argument("--gpu-hour-usd", type=float, help="default: the calibration's own price")
    parser.add_argument("--calibration", choices=sorted(DEDICATED), default=DEEPSEEK.dedicated)
    parser.add_argument("--serverless", choices=sorted(SERVERLESS), help="default: the calibration's partner")
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    pair = Pair(args.calibration, args.serverless or PARTNERS[args.calibration][0], args.gpu_hour_usd)
    out = args.out or Path(tempfile.mkdtemp(prefix="plan-vs-replay-"))
    if args.superpose and not args.trace:
        raise SystemExit("--superpose needs --trace")
    slices = (
        {"trace": (args.trace, args.start)}
        if args.trace
        else {n: (args.traces / SLICES[n][0], SLICES[n][1]) for n in args.slice}
    )
    if args.superpose:
        laid = superpose(args.trace, args.superpose, args.minutes, out / "superposed.csv")
        slices = {"+".join(f"{m:g}" for m in args.superpose): (laid, 0.0)}
    print(f"python -m bench.plan_vs_replay {' '.join(sys.argv[1:])}  (work files: {out})", flush=True)
    print("| slice | plan | SLO met, model / replay | cost | TTFT p95 | spill |")
    print("|---|---|---|---|---|---|", flush=True)
    results: list[Comparison] = []
    labels = args.plans
    for name, (file, start) in slices.items():
        for label in labels:
            plan = parse_plan(label)
            found = compare(
                Slice(name, file, start, args.minutes), plan, args.speed, out / name / label, pair
            )
            results.append(found)
            print(_row(found), flush=True)
    worst = max(results, key=lambda c: abs(c.attainment_points))
    print(
        f"\nlargest gaps: attainment {max(abs(c.attainment_points) for c in results):.1f} pt ({worst.plan.label}), "
        f"cost {max(abs(c.cost_ratio) for c in results):.1%}, p95 {max(abs(c.p95_ratio) for c in results):.1%}"
    )
    if len(labels) > 1:
        for name in slices:
            mine = [c for c in results if c.slice == name]
            chosen = choose([c.predicted for c in mine], target=0.95)["chosen"]
            best = choose([c.measured | {"plan": c.plan.label} for c in mine], target=0.95)["chosen"]
            by_label = {c.plan.label: c.measured for c in mine}
            if chosen is None or best is None:
                print(f"{name}: model chose {chosen}, replay's best {best}")
                continue
            ratio = by_label[chosen]["cost_per_slo_success_usd"] / by_label[best]["cost_per_slo_success_usd"]
            print(
                f"{name}: model chose {chosen}; best replayed {best}; chosen / best, replayed: {ratio:.3f}x"
            )
    (out / "comparisons.json").write_bytes(
        orjson.dumps(
            [
                {"slice": c.slice, "plan": c.plan.label, "predicted": c.predicted, "measured": c.measured}
                for c in results
            ],
            option=orjson.OPT_INDENT_2,
        )
    )


if __name__ == "__main__":
    main()
