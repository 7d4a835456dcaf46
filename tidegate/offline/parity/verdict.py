"""From every answer of a parity run to a verdict per endpoint and a matrix per case.

An endpoint `diverges` when its pass rate's 95% Wilson interval lies wholly below the
reference's, or fewer than `min_agreement` of its answers agree with the reference's; it is
at `parity` when its pass rate is at least the reference's and its agreement holds; anything
between (a lower pass rate whose interval still overlaps the reference's, no answer at all) is
`inconclusive`: run more repeats.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from tidegate.offline.stats import percentile

Z95 = NormalDist().inv_cdf(0.975)

PARITY, DIVERGES, INCONCLUSIVE, REFERENCE = "parity", "diverges", "inconclusive", "reference"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request of the run: which endpoint, case and repeat, and what came of it."""

    endpoint: str
    case: str
    repeat: int
    error: str | None  # the request failed (status, timeout, not an answer); None: answered
    failures: tuple[str, ...] = ()  # the expectations it missed
    agreed: bool | None = None  # with the reference (None: no rule, or nothing to compare)
    refused: bool = False
    output_tokens: int | None = None
    cost_usd: float = 0.0
    latency_ms: float | None = None
    answer: dict[str, Any] = field(default_factory=dict)  # text and tool calls, cut short

    @property
    def passed(self) -> bool:
        return self.error is None and not self.failures


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (Wilson 1927; E. B. Wilson, JASA 22:209):
    unlike the normal approximation it stays inside [0, 1] and is honest at 0 or n successes,
    which is where a parity run's pass rates live. (0, 1) for no trials."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))  # rounding at 0 and n


def summarise(endpoint: str, outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """An endpoint's line: pass rate and interval, agreement, refusals, errors, lengths, cost."""
    passed = sum(o.passed for o in outcomes)
    compared = [o.agreed for o in outcomes if o.agreed is not None]
    answered = [o for o in outcomes if o.error is None]
    lengths = [o.output_tokens for o in answered if o.output_tokens is not None]
    low, high = wilson(passed, len(outcomes))
    return {
        "endpoint": endpoint,
        "requests": len(outcomes),
        "passed": passed,
        "pass_rate": _round(passed / len(outcomes)) if outcomes else None,
        "pass_interval": [_round(low), _round(high)],
        "agreement": _round(sum(compared) / len(compared)) if compared else None,
        "compared": len(compared),
        "refusal_rate": _round(sum(o.refused for o in answered) / len(answered)) if answered else None,
        "errors": len(outcomes) - len(answered),
        "output_tokens": _lengths(lengths),
        "cost_usd": round(sum(o.cost_usd for o in outcomes), 6),
    }


def _lengths(lengths: list[int]) -> dict[str, float] | None:
    if not lengths:
        return None
    return {
        "p50": statistics.median(lengths),
        "p95": percentile([float(n) for n in lengths], 95),
        "max": max(lengths),
        "mean": round(statistics.fmean(lengths), 1),
    }


def verdict(summary: dict[str, Any], reference: dict[str, Any], min_agreement: float) -> tuple[str, str]:
    """The endpoint's verdict against the reference's summary, and why."""
    if summary["endpoint"] == reference["endpoint"]:
        return REFERENCE, "the reference"
    if not summary["requests"] or summary["errors"] == summary["requests"]:
        return INCONCLUSIVE, "no answer"
    agreement = summary["agreement"]
    if agreement is not None and agreement < min_agreement:
        return DIVERGES, f"agrees with the reference on {agreement:.0%} of answers (< {min_agreement:.0%})"
    low, high = summary["pass_interval"]
    ref_low, ref_high = reference["pass_interval"]
    if high < ref_low:
        return DIVERGES, (
            f"passes {summary['pass_rate']:.0%} [{low:.0%}, {high:.0%}] against the reference's "
            f"{reference['pass_rate']:.0%} [{ref_low:.0%}, {ref_high:.0%}]: the intervals are apart"
        )
    if reference["pass_rate"] is not None and summary["pass_rate"] < reference["pass_rate"]:
        return INCONCLUSIVE, (
            f"passes {summary['pass_rate']:.0%} against the reference's {reference['pass_rate']:.0%}, "
            "within the intervals: run more repeats"
        )
    return PARITY, "passes at least as often as the reference" + (
        f", agrees on {agreement:.0%}" if agreement is not None else ""
    )


def case_matrix(outcomes: Iterable[Outcome]) -> dict[str, dict[str, dict[str, Any]]]:
    """case -> endpoint -> passed of repeats, and each distinct way it failed."""
    matrix: dict[str, dict[str, dict[str, Any]]] = {}
    for o in outcomes:
        cell = matrix.setdefault(o.case, {}).setdefault(
            o.endpoint, {"passed": 0, "repeats": 0, "disagreed": 0, "how": []}
        )
        cell["repeats"] += 1
        cell["passed"] += o.passed
        cell["disagreed"] += o.agreed is False
        for why in ([o.error] if o.error else list(o.failures)) + (
            ["disagrees with the reference"] if o.agreed is False else []
        ):
            if why not in cell["how"]:
                cell["how"].append(why)
    return matrix


def failed_cases(matrix: dict[str, dict[str, dict[str, Any]]], endpoint: str) -> list[str]:
    """The cases an endpoint failed or disagreed on at least once."""
    found = []
    for case, cells in matrix.items():
        cell = cells.get(endpoint)
        if cell is not None and (cell["passed"] < cell["repeats"] or cell["disagreed"]):
            found.append(case)
    return found


def _round(value: float) -> float:
    return round(value, 4)
