"""Predicted-TTFT admission against fixed slot caps on slices it was not tuned on, in the model
(`tidegate plan`'s): one `deepseek-r1-h200` replica, SLO TTFT <= 2 s, the serverless route
scaling to zero (cold) or kept warm every 30 s, SLO attainment and m$ per SLO-successful task,
each the mean over `--seeds` seeds (a cold load lasts 10-30 s, so one seed of a bursty slice
moves by points). The policy has no per-trace knob: its budget is the SLO, its ceiling 64.

    python -m bench.admission_out_of_sample [--seeds 4] [--caps 8 16 32]
"""

from __future__ import annotations

import argparse
import statistics

from bench.plan_vs_replay import TRACES
from tidegate.offline.calibration import DEDICATED, SERVERLESS
from tidegate.offline.planner.plans import Plan, System
from tidegate.offline.planner.sweep import evaluate
from tidegate.offline.replay import load, window

SLICES = (("code", 0), ("code", 20), ("code", 40), ("conv", 0), ("conv", 20), ("conv", 40))
SLO_TTFT_MS = 2000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--caps", type=int, nargs="+", default=[8, 16, 32])
    args = parser.parse_args()
    system = System(DEDICATED["deepseek-r1-h200"], SERVERLESS["deepseek-serverless"])
    print("| slice | " + " | ".join(f"c={c}" for c in args.caps) + " | predicted (2 s, ceiling 64) |")
    print("|---" * (len(args.caps) + 2) + "|")
    for name, start in SLICES:
        rows = window(load(TRACES / f"AzureLLMInferenceTrace_{name}.csv"), start, 20)
        for warm in (0.0, 30.0):
            plans = [Plan(1, c, keep_warm_s=warm) for c in args.caps]
            plans.append(Plan(1, 64, ttft_budget_ms=SLO_TTFT_MS, keep_warm_s=warm))
            cells = []
            for plan in plans:
                runs = [
                    evaluate(rows, plan, system, slo_ttft_ms=SLO_TTFT_MS, span_s=1200.0, seed=seed)
                    for seed in range(args.seeds)
                ]
                attainment = statistics.fmean(r["slo_attainment"] for r in runs)
                per_success = statistics.fmean(r["cost_per_slo_success_usd"] for r in runs)
                cells.append(f"{attainment:.1%}, {per_success * 1000:.3f}")
            state = "kept warm" if warm else "cold"
            print(f"| {name} {start}-{start + 20}, {state} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
