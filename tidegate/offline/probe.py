"""The field notes' TTFT consistency benchmark (docs/probe.md), as statistics.

The method, in our words: call each endpoint directly, one request at a time, with the same
prompt at temperature 0, at least 75 times; throw the first few away (connection set-up,
caches); judge the rest by median, p95, standard deviation and the coefficient of variation
(CV% = std / mean x 100). CV under 40% is solid, 40-100% some variance, over 100% cold starts
(look at the p95: is it acceptable?), over 300% not production-ready for latency-sensitive
work (consider dedicated). Spread runs over the day: peak and off-peak differ.

Errors are counted and shown; the statistics are computed over the successful requests, and
the summary says so. With a CV over 100%, 75 samples pin a p95 down poorly: the ranking says
when that is the case instead of trusting the order.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from router.economics.routes_report import cv_verdict
from tidegate.offline.stats import percentile

MIN_SAMPLES = 75  # the note's minimum for a verdict


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One probe request (times in ms; None when it failed before that point)."""

    endpoint: str
    index: int
    at: float  # wall-clock start
    warmup: bool
    status: int | None
    error: str | None
    ttft_ms: float | None
    itl_ms: float | None  # mean gap between output events
    e2e_ms: float | None
    output_tokens: int | None

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft_ms is not None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def summarise(endpoint: str, results: Iterable[ProbeResult]) -> dict[str, Any]:
    """An endpoint's line of the table: over its non-warm-up requests."""
    measured = [r for r in results if not r.warmup]
    ok = [r for r in measured if r.ok]
    errors = len(measured) - len(ok)
    summary: dict[str, Any] = {
        "endpoint": endpoint,
        "requests": len(measured),
        "n": len(ok),
        "errors": errors,
        "statistics_over": "successful requests" if errors else "all requests",
    }
    if not ok:
        return summary | {"verdict": "no successful request"}
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    mean = statistics.fmean(ttft)
    std = statistics.pstdev(ttft) if len(ttft) > 1 else 0.0
    cv = std / mean * 100 if mean > 0 else 0.0
    itl = [r.itl_ms for r in ok if r.itl_ms is not None]
    e2e = [r.e2e_ms for r in ok if r.e2e_ms is not None]
    verdict = cv_verdict(cv) if len(ttft) >= MIN_SAMPLES else f"too few samples (< {MIN_SAMPLES})"
    return summary | {
        "ttft_ms": {
            "median": round(statistics.median(ttft), 2),
            "p95": round(percentile(ttft, 95), 2),
            "p99": round(percentile(ttft, 99), 2),
            "mean": round(mean, 2),
            "std": round(std, 2),
        },
        "cv_percent": round(cv, 1),
        "verdict": verdict,
        "itl_p50_ms": round(statistics.median(itl), 2) if itl else None,
        "e2e_p95_ms": round(percentile(e2e, 95), 2) if e2e else None,
    }


def ranking(summaries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Endpoints by p95 TTFT (those without one last), each with a caution when its CV makes
    the p95 untrustworthy at this sample size."""
    ranked = sorted(
        summaries, key=lambda s: (s.get("ttft_ms") is None, (s.get("ttft_ms") or {}).get("p95", 0.0))
    )
    out = []
    for place, summary in enumerate(ranked, start=1):
        caution = None
        cv = summary.get("cv_percent")
        if cv is not None and cv > 100:
            caution = (
                f"CV {cv:.0f}% over 100%: with {summary['n']} samples the p95 is untrustworthy "
                "(cold starts move it from run to run)"
            )
        p95 = (summary.get("ttft_ms") or {}).get("p95")
        out.append(
            {
                "rank": place,
                "endpoint": summary["endpoint"],
                "p95_ms": p95,
                "cv_percent": cv,
                "verdict": summary["verdict"],
                "caution": caution,
            }
        )
    return out


def by_hour(results: Iterable[ProbeResult]) -> dict[str, dict[str, Any]]:
    """Per UTC hour of day: n, median and p95 TTFT (peak vs off-peak over a scheduled probe)."""
    from datetime import UTC, datetime  # noqa: PLC0415

    hours: dict[int, list[float]] = {}
    for r in results:
        if r.ok and not r.warmup and r.ttft_ms is not None:
            hours.setdefault(datetime.fromtimestamp(r.at, UTC).hour, []).append(r.ttft_ms)
    return {
        f"{hour:02d}": {
            "n": len(v),
            "median": round(statistics.median(v), 2),
            "p95": round(percentile(v, 95), 2),
        }
        for hour, v in sorted(hours.items())
    }
