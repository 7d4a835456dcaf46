"""The planner over a week at a busy service's rate: tens of millions of requests, too many to
run every plan of a grid through the discrete-event model (about 7 µs per request and plan).

A stratified sample of the trace stands in for it. The trace is cut into slices (`slice_s`);
slices whose request counts are within a factor `ratio` of each other form a stratum (an
hour of the office's peak and an hour of the night do not share one); from each stratum
`per_stratum` slices, spread evenly over the trace, run through the discrete-event model, each
after a warm-up of the trace's own `warmup_s` before it (the gateway's windows, the queues and
the serverless route's cold state carry into the slice as they would). A sampled request
stands for its stratum's requests over the stratum's sampled ones: attainment, serverless
spend, spill share and slot time are estimated from the sample; dedicated and keep-warm spend
are exact (they follow from the span). Every slice is modelled whole, so bursts inside a slice
are the trace's own; what the sample cannot see is a burst longer than a slice.
bench/plan_sampled.py checks it against the exact model plan for plan.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ddsketch import DDSketch

from router.economics.cost import token_cost_usd
from tidegate.offline.planner.model import simulate_keep_warm
from tidegate.offline.planner.plans import SERVERLESS_ROUTE, Plan, System
from tidegate.offline.planner.sweep import in_keep_warm_groups, pricing, settings
from tidegate.offline.replay import SPILL_REASONS, Arrival, Pricing

SLICE_S = 300.0
PER_STRATUM = 3
RATIO = 1.25
WARMUP_S = 120.0
AUTO_ABOVE = 1_000_000  # requests: above this `tidegate plan` samples unless told not to


@dataclass(frozen=True, slots=True)
class Slice:
    """One sampled slice: its warm-up's arrivals then its own, timed from the warm-up's start."""

    arrivals: tuple[Arrival, ...]
    counted_from: int  # the first of the slice's own arrivals
    start_s: float  # where the slice starts, in the trace's time
    offset_s: float  # the trace time of this slice's time 0 (the warm-up's start)
    weight: float  # requests of its stratum per sampled request of the stratum
    stratum: int


@dataclass(frozen=True, slots=True)
class Sample:
    slices: tuple[Slice, ...]
    requests: int  # in the whole trace
    span_s: float
    last_at_s: float  # the trace's last arrival (keep-warm pings run until then)
    slice_s: float
    slices_in_trace: int  # with traffic
    strata: int
    tokens: tuple[tuple[int, int], ...]  # per stratum, every request's prompt and answer tokens

    @property
    def modelled(self) -> int:
        return sum(len(s.arrivals) for s in self.slices)

    def describe(self) -> dict[str, Any]:
        return {
            "slice_s": self.slice_s,
            "slices": len(self.slices),
            "of_slices": self.slices_in_trace,
            "strata": self.strata,
            "requests_modelled": self.modelled,
            "of_requests": self.requests,
        }


def sample(
    arrivals: Sequence[Arrival],
    span_s: float,
    *,
    slice_s: float = SLICE_S,
    per_stratum: int = PER_STRATUM,
    ratio: float = RATIO,
    warmup_s: float = WARMUP_S,
) -> Sample:
    """The slices that stand for `arrivals` (sorted by time)."""
    if slice_s <= 0 or per_stratum < 1 or ratio <= 1 or warmup_s < 0:
        raise ValueError("sampling needs slice_s > 0, per_stratum >= 1, ratio > 1 and warmup_s >= 0")
    spans = _spans(arrivals, slice_s)
    strata: dict[int, list[int]] = {}
    for index, span in enumerate(spans):
        if span.requests:
            strata.setdefault(math.floor(math.log(span.requests) / math.log(ratio)), []).append(index)
    slices: list[Slice] = []
    tokens: list[tuple[int, int]] = []
    for stratum, members in enumerate(strata.values()):
        picked = [members[math.floor((j + 0.5) * len(members) / per_stratum)] for j in range(per_stratum)]
        picked = sorted(set(picked))
        weight = sum(spans[i].requests for i in members) / sum(spans[i].requests for i in picked)
        cut = functools.partial(_slice, arrivals, warmup_s=warmup_s, weight=weight, stratum=stratum)
        slices += [cut((spans[i].first, spans[i].last), i * slice_s) for i in picked]
        tokens.append((sum(spans[i].prompt for i in members), sum(spans[i].answer for i in members)))
    return Sample(
        slices=tuple(sorted(slices, key=lambda s: s.start_s)),
        requests=len(arrivals),
        span_s=span_s,
        last_at_s=arrivals[-1].at_s if arrivals else 0.0,
        slice_s=slice_s,
        slices_in_trace=sum(len(m) for m in strata.values()),
        strata=len(strata),
        tokens=tuple(tokens),
    )


@dataclass(frozen=True, slots=True)
class _Span:
    """One slice of the trace: the index range of its arrivals and their tokens."""

    first: int
    last: int
    prompt: int
    answer: int

    @property
    def requests(self) -> int:
        return self.last - self.first


def _spans(arrivals: Sequence[Arrival], slice_s: float) -> list[_Span]:
    """Every slice from 0 to the last arrival, in one pass over a trace (tens of millions of
    rows for a week), which must be in time order."""
    spans: list[_Span] = []
    first = prompt = answer = 0
    previous = -math.inf
    for index, a in enumerate(arrivals):
        if a.at_s < previous:
            raise ValueError("sampling needs the arrivals in time order")
        previous = a.at_s
        while a.at_s >= (len(spans) + 1) * slice_s:
            spans.append(_Span(first, index, prompt, answer))
            first, prompt, answer = index, 0, 0
        prompt += a.input_tokens
        answer += a.output_tokens
    if arrivals:
        spans.append(_Span(first, len(arrivals), prompt, answer))
    return spans


def _slice(
    arrivals: Sequence[Arrival],
    bounds: tuple[int, int],
    start_s: float,
    *,
    warmup_s: float,
    weight: float,
    stratum: int,
) -> Slice:
    first, last = bounds
    begin = first
    while begin > 0 and arrivals[begin - 1].at_s >= start_s - warmup_s:
        begin -= 1
    offset = max(0.0, start_s - warmup_s)
    timed = tuple(Arrival(a.at_s - offset, a.input_tokens, a.output_tokens) for a in arrivals[begin:last])
    return Slice(timed, first - begin, start_s, offset, weight, stratum)


def evaluate_sampled(
    sample: Sample, plan: Plan, system: System, *, slo_ttft_ms: float, seed: int = 0
) -> dict[str, Any]:
    """One plan's estimated figures, in the form the exact `evaluate` gives them (each slice
    draws from its own seed)."""
    [found] = evaluate_sampled_keep_warm(sample, [plan], system, slo_ttft_ms=slo_ttft_ms, seed=seed)
    return found


def evaluate_sampled_keep_warm(
    sample: Sample, plans: Sequence[Plan], system: System, *, slo_ttft_ms: float, seed: int = 0
) -> list[dict[str, Any]]:
    """`evaluate_sampled` for plans alike but for keep-warm (model.py `simulate_keep_warm`,
    slice by slice)."""
    costs = [pricing(plan, system, sample.last_at_s) for plan in plans]
    tallies = [_Tally(slo_ttft_ms, c.serverless_usd_per_mtok[SERVERLESS_ROUTE]) for c in costs]
    for number, piece in enumerate(sample.slices):
        end = piece.start_s - piece.offset_s + sample.slice_s
        runs = simulate_keep_warm(piece.arrivals, plans, system, seed=seed * 100_003 + number)
        for tally, records in zip(tallies, runs, strict=True):
            for record in records[piece.counted_from :]:
                tally.add(record, piece, end)
    together = zip(plans, costs, tallies, strict=True)
    return [_figures(sample, plan, costed, tally) for plan, costed, tally in together]


def _figures(sample: Sample, plan: Plan, costed: Pricing, tally: _Tally) -> dict[str, Any]:
    dedicated_usd = costed.dedicated_usd_per_hour * sample.span_s / 3600
    serverless_usd = tally.serverless_usd(sample)
    cost = dedicated_usd + serverless_usd + costed.keep_warm_usd
    provisioned = costed.dedicated_slots * sample.span_s
    successes = tally.within + tally.batch_done
    found = tally.figures(sample) | {
        "span_s": sample.span_s,
        "dedicated_usd": round(dedicated_usd, 6),
        "serverless_usd": round(serverless_usd, 6),
        "keep_warm_usd": round(costed.keep_warm_usd, 6),
        "cost_usd": round(cost, 6),
        "dedicated_utilization": round(tally.busy_s / provisioned, 4) if provisioned > 0 else None,
        "cost_per_slo_success_usd": round(cost / successes, 8) if successes else None,
        "sampled": sample.describe(),
    }
    return {"plan": plan.label, "settings": settings(plan)} | found


def sweep_sampled(
    sample: Sample,
    plans: Iterable[Plan],
    system: System,
    *,
    slo_ttft_ms: float,
    progress: Callable[[int], None] = lambda _: None,
    jobs: int = 1,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """`sweep` over the sample: every plan's estimated figures, in the plans' order."""
    one = functools.partial(_evaluate_group, slo_ttft_ms=slo_ttft_ms, seed=seed)
    return in_keep_warm_groups(one, list(plans), jobs, progress, shared=(sample, system))


def _evaluate_group(
    plans: Sequence[Plan], sample: Sample, system: System, *, slo_ttft_ms: float, seed: int
) -> list[dict[str, Any]]:
    return evaluate_sampled_keep_warm(sample, plans, system, slo_ttft_ms=slo_ttft_ms, seed=seed)


class _Tally:
    """Weighted sums over the sampled requests, as tidegate/offline/replay.py `summary` counts."""

    def __init__(self, slo_ttft_ms: float, serverless_usd_per_mtok: tuple[float, float]) -> None:
        self.slo_ttft_ms = slo_ttft_ms
        self.prices = serverless_usd_per_mtok
        self.spent: dict[int, list[float]] = {}  # per stratum: sampled serverless spend, every request's
        self.requests = self.ok = self.within = self.spilled = self.input_tokens = 0.0
        self.batch = self.batch_done = self.batch_on_dedicated = 0.0
        self.busy_s = 0.0
        self.routes: dict[str, float] = {}
        self.ttft = DDSketch(0.005)
        self.minutes: dict[int, DDSketch] = {}

    def add(self, r: dict[str, Any], piece: Slice, end_s: float) -> None:
        w = piece.weight
        spent = self.spent.setdefault(piece.stratum, [0.0, 0.0])
        usd = token_cost_usd(r["input_tokens"], r["output_tokens"], *self.prices)
        spent[1] += usd
        if r.get("ok"):
            if r["route"] == SERVERLESS_ROUTE:
                spent[0] += usd
            else:
                held_from = max(float(r.get("admitted_s", r["at_s"])), piece.start_s - piece.offset_s)
                self.busy_s += w * max(0.0, min(r["at_s"] + r["e2e_ms"] / 1000, end_s) - held_from)
        if r.get("batch"):
            self.batch += w
            self.batch_done += w if r.get("ok") else 0.0
            self.batch_on_dedicated += w if r.get("reason") == "batch" else 0.0
            return
        self.requests += w
        self.input_tokens += w * r["input_tokens"]
        if not r.get("ok"):
            return
        self.ok += w
        route = r.get("route") or "-"
        self.routes[route] = self.routes.get(route, 0.0) + w
        self.spilled += w if r.get("reason") in SPILL_REASONS else 0.0
        ttft = r["ttft_ms"]
        self.within += w if ttft <= self.slo_ttft_ms else 0.0
        self.ttft.add(ttft, w)
        minute = int((r["at_s"] + piece.offset_s) // 60)
        self.minutes.setdefault(minute, DDSketch(0.005)).add(ttft, w)

    def serverless_usd(self, sample: Sample) -> float:
        """Per stratum, the sampled share of its token-priced work that serverless served, times
        what all of the stratum's tokens cost (a ratio estimate: the token mix of a stratum's
        slices varies more than their request counts)."""
        total = 0.0
        for stratum, (served, everything) in self.spent.items():
            if everything > 0:
                total += served / everything * token_cost_usd(*sample.tokens[stratum], *self.prices)
        return total

    def figures(self, sample: Sample) -> dict[str, Any]:
        n, ok = self.requests, self.ok
        worst = max(self.minutes.items(), key=lambda m: m[1].get_quantile_value(0.95) or 0.0, default=None)
        found: dict[str, Any] = {
            "requests": round(n),
            "sent": round(n),
            "succeeded": round(ok),
            "errors": round(n - ok),
            "not_sent": 0,
            "slo_ttft_ms": self.slo_ttft_ms,
            "slo_attainment": round(self.within / n, 4) if n else None,
            "ttft_ms": {
                "p50": _quantile(self.ttft, 0.50),
                "p95": _quantile(self.ttft, 0.95),
                "p99": _quantile(self.ttft, 0.99),
                "worst_minute": None
                if worst is None
                else {"minute": worst[0], "p95": _quantile(worst[1], 0.95), "of_sampled_minutes": True},
            },
            "spill_share": round(self.spilled / ok, 4) if ok else None,
            "routes": {route: round(count) for route, count in sorted(self.routes.items())},
            "mean_input_tokens": round(self.input_tokens / n, 1) if n else None,
        }
        if self.batch:
            found["batch"] = {
                "requests": round(self.batch),
                "answered": round(self.batch_done),
                "on_dedicated": round(self.batch_on_dedicated),
            }
        return found


def _quantile(sketch: DDSketch, q: float) -> float | None:
    value = sketch.get_quantile_value(q) if sketch.count else None
    return None if value is None else round(value, 2)
