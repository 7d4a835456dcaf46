"""Sweep plans through the model, pick the cheapest that meets the SLO, and say what the
others would need: the Pareto front of cost against SLO attainment, and per plan the GPU-hour
price (or serverless price) at which it would beat all-serverless.

The objective is the field notes' metric: cost per SLO-successful task (a request answered
with its first token within the SLO). A plan "meets the SLO" when that share of all requests
is at least the target attainment.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from router.economics.cost import token_cost_usd
from tidegate.offline.planner.model import keep_warm_groups, simulate_keep_warm
from tidegate.offline.planner.plans import SERVERLESS_ROUTE, Plan, System, dedicated_route, keep_warm_times
from tidegate.offline.planner.workers import in_processes
from tidegate.offline.replay import Arrival, Pricing, summary


@dataclass(frozen=True, slots=True)
class Grid:
    replicas: Sequence[int] = (0, 1, 2)
    max_concurrency: Sequence[int] = (8, 16, 32, 64)
    max_queue_ms: Sequence[float] = (0.0, 250.0, 1000.0)
    canary_percent: Sequence[float] = (100.0, 75.0, 50.0)
    # predicted-TTFT admission (routing.admission predicted_ttft) at these budgets, with
    # `predicted_ceiling` slots (None: the largest max_concurrency); empty: slots only
    ttft_budget_ms: Sequence[float] = ()
    predicted_ceiling: int | None = None
    # serverless keep-warm interval (0: off); 30 s is under the calibrations' 60 s scale-to-zero
    keep_warm_s: Sequence[float] = (0.0, 30.0)

    def plans(self) -> list[Plan]:
        """Every combination; a plan without dedicated replicas once per keep-warm setting
        (the other knobs do nothing there)."""
        found: list[Plan] = []
        for warm in self.keep_warm_s:
            for replicas in sorted(set(self.replicas)):
                if replicas == 0:
                    found.append(Plan(0, keep_warm_s=warm))
                    continue
                for c, q, p in itertools.product(
                    self.max_concurrency, self.max_queue_ms, self.canary_percent
                ):
                    found.append(Plan(replicas, c, q, p, keep_warm_s=warm))
                ceiling = self.predicted_ceiling or max(self.max_concurrency)
                for budget, p in itertools.product(self.ttft_budget_ms, self.canary_percent):
                    found.append(Plan(replicas, ceiling, 0.0, p, budget, warm))
        return found


KEEP_WARM_PROMPT_TOKENS = 8  # keep_warm.prompt_tokens' default: a ping's priced input


def pricing(plan: Plan, system: System, until_s: float = 0.0) -> Pricing:
    s = system.serverless
    ping_usd = token_cost_usd(KEEP_WARM_PROMPT_TOKENS, 1, s.usd_per_mtok_in, s.usd_per_mtok_out)
    return Pricing(
        dedicated_usd_per_hour=plan.replicas * system.dedicated.usd_per_hour,
        dedicated_slots=plan.replicas * plan.max_concurrency,
        dedicated_routes=frozenset(dedicated_route(i) for i in range(plan.replicas)),
        serverless_usd_per_mtok={SERVERLESS_ROUTE: (s.usd_per_mtok_in, s.usd_per_mtok_out)},
        keep_warm_usd=len(keep_warm_times(plan, until_s)) * ping_usd,
    )


def evaluate(
    arrivals: Sequence[Arrival],
    plan: Plan,
    system: System,
    *,
    slo_ttft_ms: float,
    span_s: float,
    seed: int = 0,
) -> dict[str, Any]:
    """One plan's predicted figures: the replay summary of the model's records."""
    [found] = evaluate_keep_warm(arrivals, [plan], system, slo_ttft_ms=slo_ttft_ms, span_s=span_s, seed=seed)
    return found


def evaluate_keep_warm(
    arrivals: Sequence[Arrival],
    plans: Sequence[Plan],
    system: System,
    *,
    slo_ttft_ms: float,
    span_s: float,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """`evaluate` for plans alike but for keep-warm (model.py `simulate_keep_warm`)."""
    until_s = arrivals[-1].at_s if arrivals else 0.0
    found = []
    for plan, records in zip(plans, simulate_keep_warm(arrivals, plans, system, seed), strict=True):
        costed = pricing(plan, system, until_s)
        figures = summary(records, slo_ttft_ms, lag_p99_ms=math.inf, pricing=costed, span_s=span_s)
        figures.pop("client_kept_up", None)
        figures.pop("send_lag_ms", None)
        found.append({"plan": plan.label, "settings": settings(plan)} | figures)
    return found


def settings(plan: Plan) -> dict[str, Any]:
    if plan.replicas == 0:  # no dedicated pool: its knobs do not apply
        return {
            "replicas": 0,
            "max_concurrency": None,
            "max_queue_ms": None,
            "canary_percent": None,
            "admission": None,
            "ttft_budget_ms": None,
            "keep_warm_s": plan.keep_warm_s,
        }
    return {
        "replicas": plan.replicas,
        "max_concurrency": plan.max_concurrency,
        "max_queue_ms": plan.max_queue_ms,
        "canary_percent": plan.canary_percent,
        "admission": "slots" if plan.ttft_budget_ms is None else "predicted_ttft",
        "ttft_budget_ms": plan.ttft_budget_ms,
        "keep_warm_s": plan.keep_warm_s,
    }


def sweep(
    arrivals: Sequence[Arrival],
    plans: Iterable[Plan],
    system: System,
    *,
    slo_ttft_ms: float,
    span_s: float,
    progress: Callable[[int], None] = lambda _: None,
    jobs: int = 1,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Every plan's figures, in the plans' order; `jobs` processes at once (each plan is
    modelled on its own, or with its keep-warm variants, so the figures do not depend on how
    many). `progress(n)`: n more plans done."""
    one = functools.partial(_evaluate_group, slo_ttft_ms=slo_ttft_ms, span_s=span_s, seed=seed)
    return in_keep_warm_groups(one, list(plans), jobs, progress, shared=(arrivals, system))


def in_keep_warm_groups(
    evaluate_group: Callable[..., list[dict[str, Any]]],
    plans: Sequence[Plan],
    jobs: int,
    progress: Callable[[int], None],
    shared: tuple[Any, ...],
) -> list[dict[str, Any]]:
    """`evaluate_group(group, *shared)` over the plans grouped by `keep_warm_groups`, on
    `jobs` processes; the results back in the plans' order."""
    groups = keep_warm_groups(plans)
    items = [[plans[i] for i in group] for group in groups]
    done = in_processes(evaluate_group, items, jobs, progress=progress, shared=shared, size=len)
    found: list[dict[str, Any]] = [{} for _ in plans]
    for group, results in zip(groups, done, strict=True):
        for index, result in zip(group, results, strict=True):
            found[index] = result
    return found


def _evaluate_group(
    plans: Sequence[Plan],
    arrivals: Sequence[Arrival],
    system: System,
    *,
    slo_ttft_ms: float,
    span_s: float,
    seed: int,
) -> list[dict[str, Any]]:
    return evaluate_keep_warm(arrivals, plans, system, slo_ttft_ms=slo_ttft_ms, span_s=span_s, seed=seed)


def _per_success(result: dict[str, Any]) -> float:
    value = result.get("cost_per_slo_success_usd")
    return float("inf") if value is None else float(value)


def choose(results: Sequence[dict[str, Any]], target: float) -> dict[str, Any]:
    """The cheapest plan per SLO-successful task among those meeting the target, the runner-up,
    and why the runner-up lost (or why no plan won)."""
    meeting = sorted((r for r in results if (r["slo_attainment"] or 0) >= target), key=_per_success)
    if not meeting:
        best = max(results, key=lambda r: r["slo_attainment"] or 0)
        return {
            "chosen": None,
            "runner_up": None,
            "why": f"no plan meets {target:.1%} of requests within the SLO; the best, {best['plan']}, "
            f"meets {best['slo_attainment']:.1%}",
        }
    chosen = meeting[0]
    cheaper_missing = [
        r for r in results if _per_success(r) < _per_success(chosen) and (r["slo_attainment"] or 0) < target
    ]
    runner_up = meeting[1] if len(meeting) > 1 else None
    reasons = []
    if runner_up is not None:
        extra = _per_success(runner_up) / _per_success(chosen) - 1
        reasons.append(f"the runner-up, {runner_up['plan']}, costs {extra:.1%} more per SLO-successful task")
    if cheaper_missing:
        cheapest = min(cheaper_missing, key=_per_success)
        reasons.append(
            f"the cheaper {cheapest['plan']} meets the SLO on only "
            f"{cheapest['slo_attainment']:.1%} of requests"
        )
    return {
        "chosen": chosen["plan"],
        "runner_up": None if runner_up is None else runner_up["plan"],
        "why": "; ".join(reasons) or "the only plan meeting the SLO",
    }


def pareto(results: Sequence[dict[str, Any]]) -> list[str]:
    """Plans no other plan beats on both cost per SLO-successful task and attainment."""
    front = []
    for r in results:
        dominated = any(
            _per_success(o) <= _per_success(r)
            and (o["slo_attainment"] or 0) >= (r["slo_attainment"] or 0)
            and (_per_success(o) < _per_success(r) or (o["slo_attainment"] or 0) > (r["slo_attainment"] or 0))
            for o in results
        )
        if not dominated:
            front.append(r["plan"])
    return front


def break_even(result: dict[str, Any], all_serverless: dict[str, Any], system: System) -> dict[str, Any]:
    """The prices at which `result` costs what all-serverless costs per SLO-successful task.

    Cost per success is (g x H + m x S) / n for a GPU-hour price g (H GPU-hours), serverless
    spend S at m times today's prices and n SLO successes; all-serverless is m x A / n0. So the
    plan wins below g* = (A n / n0 - S) / H, or above m* = g H / (A n / n0 - S)."""
    n, n0 = _successes(result), _successes(all_serverless)
    gpu_hours = result["settings"]["replicas"] * system.dedicated.gpus * result["span_s"] / 3600
    if gpu_hours == 0 or n == 0 or n0 == 0:
        return {"gpu_hour_usd": None, "serverless_price_x": None}
    matched = all_serverless["cost_usd"] * n / n0 - result["serverless_usd"]
    if matched <= 0:
        return {"gpu_hour_usd": 0.0, "serverless_price_x": None}
    return {
        "gpu_hour_usd": round(matched / gpu_hours, 4),
        "serverless_price_x": round(system.dedicated.gpu_hour_usd * gpu_hours / matched, 3),
    }


def _successes(result: dict[str, Any]) -> float:
    return float(result["slo_attainment"] or 0.0) * int(result["requests"])
