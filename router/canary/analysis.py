"""One canary analysis: dedicated against serverless over the same interval, judged on what
matters for LLM serving (TTFT tail, inter-token latency, errors, success, cost per success).

Pure functions of the interval's merged figures: the controller (router/canary/controller.py)
gathers them from the store, `tidegate canary plan` shows them without acting.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from router.canary.weights import Rates
from router.config import CanaryChecks
from router.economics.cost import per_success

PASS, FAIL, NO_DATA, SKIPPED = "pass", "fail", "no_data", "skipped"
# Checks of a latency: with no figure on either side, that kind of traffic did not occur in the
# interval (no request streamed: no TTFT, no ITL) and the check is skipped, not missing.
LATENCY_CHECKS = frozenset({"ttft_p95_ratio", "itl_p50_ratio", "e2e_per_token_p95_ratio", "ttft_p95_ms"})


class Verdict(StrEnum):
    PASS = "pass"  # every check passed: step up
    FAIL = "fail"  # a check failed: count towards failure_threshold
    INCONCLUSIVE = "inconclusive"  # too few samples on a side: hold


@dataclass(frozen=True, slots=True)
class Side:
    """One side's figures over the interval (None: no samples for that figure). `requests`,
    `errors` and `successes` are those the route answers for (router/canary/weights.py);
    with `weighted` set, the rates are its caller-weighted ones."""

    requests: int = 0
    errors: int = 0
    successes: int = 0
    ttft_p95_ms: float | None = None
    itl_p50_ms: float | None = None
    cost_usd: float = 0.0
    successful_tasks: float = 0.0
    weighted: Rates | None = None
    e2e_per_token_p95_ms: float | None = None  # every served answer's, streamed or not

    @property
    def error_rate(self) -> float | None:
        if self.weighted is not None:
            return self.weighted.error_rate
        return self.errors / self.requests if self.requests else None

    @property
    def success_rate(self) -> float | None:
        if self.weighted is not None:
            return self.weighted.success_rate
        return self.successes / self.requests if self.requests else None

    @property
    def callers(self) -> int | None:
        return self.weighted.callers if self.weighted is not None else None

    @property
    def cost_per_success(self) -> float | None:
        return per_success(self.cost_usd, self.successful_tasks)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    result: str  # pass, fail, no_data
    dedicated: float | None
    serverless: float | None
    limit: float

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Analysis:
    verdict: Verdict
    reason: str
    dedicated: Side
    serverless: Side
    checks: tuple[Check, ...] = field(default=())

    def as_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "reason": self.reason,
            "dedicated": _side_json(self.dedicated),
            "serverless": _side_json(self.serverless),
            "checks": [c.as_json() for c in self.checks],
        }


def _side_json(side: Side) -> dict[str, Any]:
    weighted = side.weighted
    return {k: v for k, v in asdict(side).items() if k != "weighted"} | {
        "error_rate": side.error_rate,
        "success_rate": side.success_rate,
        "cost_per_success": side.cost_per_success,
        "callers": side.callers,
        "top_caller_share": weighted.top_share if weighted is not None else None,
        "left_out": list(weighted.left_out) if weighted is not None else [],
    }


def _ratio(
    check: str, dedicated: float | None, serverless: float | None, limit: float, *, at_most: bool
) -> Check:
    if dedicated is None and serverless is None and check in LATENCY_CHECKS:
        return Check(check, SKIPPED, None, None, limit)
    if dedicated is None or serverless is None or serverless <= 0:
        return Check(check, NO_DATA, dedicated, serverless, limit)
    ratio = dedicated / serverless
    ok = ratio <= limit if at_most else ratio >= limit
    return Check(check, PASS if ok else FAIL, dedicated, serverless, limit)


def _ceiling(check: str, value: float | None, limit: float, *, skip: bool = False) -> Check:
    """`skip`: the figure is missing because its kind of traffic did not occur (see LATENCY_CHECKS)."""
    if value is None and skip:
        return Check(check, SKIPPED, None, None, limit)
    result = NO_DATA if value is None else PASS if value <= limit else FAIL
    return Check(check, result, value, None, limit)


def analyse(
    dedicated: Side, serverless: Side, checks: CanaryChecks, min_samples: int, min_callers: int = 1
) -> Analysis:
    """Every configured check; FAIL if any failed, else INCONCLUSIVE when a side has fewer
    than `min_samples` requests or a check had no data, else PASS. A failure on thin data
    still counts: a dedicated side erroring on its few requests is not a reason to wait. A
    verdict whose rates rest on fewer than `min_callers` callers says so in its reason."""
    found = _analyse(dedicated, serverless, checks, min_samples)
    few = [
        f"{name} {side.callers}"
        for name, side in (("dedicated", dedicated), ("serverless", serverless))
        if side.callers is not None and side.callers < min_callers
    ]
    if not few:
        return found
    caution = f" (rests on few callers: {', '.join(few)}; min_callers {min_callers})"
    return replace(found, reason=found.reason + caution)


def _analyse(dedicated: Side, serverless: Side, checks: CanaryChecks, min_samples: int) -> Analysis:
    results = _checked(dedicated, serverless, checks)
    failed = [c.name for c in results if c.result == FAIL]
    thin = [
        name
        for name, side in (("dedicated", dedicated), ("serverless", serverless))
        if side.requests < min_samples
    ]
    if failed and not (thin and all(_noise_on_thin_data(name) for name in failed)):
        return Analysis(Verdict.FAIL, "failed: " + ", ".join(failed), dedicated, serverless, tuple(results))
    if thin:
        reason = " and ".join(
            f"{name} has {(dedicated if name == 'dedicated' else serverless).requests}" for name in thin
        )
        return Analysis(
            Verdict.INCONCLUSIVE,
            f"too few requests ({reason}; min_samples {min_samples})",
            dedicated,
            serverless,
            tuple(results),
        )
    missing = [c.name for c in results if c.result == NO_DATA]
    latency = [c for c in results if c.name in LATENCY_CHECKS]
    if latency and all(c.result == SKIPPED for c in latency):
        missing = [c.name for c in latency]  # no latency compared at all: not a pass
    if missing:
        return Analysis(
            Verdict.INCONCLUSIVE, "no data for: " + ", ".join(missing), dedicated, serverless, tuple(results)
        )
    return Analysis(Verdict.PASS, "every check passed", dedicated, serverless, tuple(results))


def check_name(field: str) -> str:
    """The check a `CanaryChecks` field sets the limit of: its name without `_max`/`_min`
    (`ttft_p95_max_ratio` -> `ttft_p95_ratio`). One declaration: the config's field names."""
    return field.replace("_max", "").replace("_min", "")


def _checked(dedicated: Side, serverless: Side, checks: CanaryChecks) -> list[Check]:
    """Every configured check's result on the two sides' figures."""
    ratios = (  # (the CanaryChecks field, dedicated, serverless, the ratio must be at most the limit)
        ("ttft_p95_max_ratio", dedicated.ttft_p95_ms, serverless.ttft_p95_ms, True),
        ("itl_p50_max_ratio", dedicated.itl_p50_ms, serverless.itl_p50_ms, True),
        (
            "e2e_per_token_p95_max_ratio",
            dedicated.e2e_per_token_p95_ms,
            serverless.e2e_per_token_p95_ms,
            True,
        ),
        ("success_rate_min_ratio", dedicated.success_rate, serverless.success_rate, False),
        ("cost_per_success_max_ratio", dedicated.cost_per_success, serverless.cost_per_success, True),
    )
    error_percent = None if dedicated.error_rate is None else dedicated.error_rate * 100
    absolutes = (  # (the CanaryChecks field, dedicated's figure)
        ("ttft_p95_max_ms", dedicated.ttft_p95_ms),
        ("error_rate_max_percent", error_percent),
    )
    results = [
        _ratio(check_name(field), d, sl, limit, at_most=most)
        for field, d, sl, most in ratios
        if (limit := getattr(checks, field)) is not None
    ]
    no_streams = dedicated.ttft_p95_ms is None and serverless.ttft_p95_ms is None
    results += [
        _ceiling(name, value, limit, skip=name in LATENCY_CHECKS and no_streams)
        for field, value in absolutes
        if (limit := getattr(checks, field)) is not None
        for name in (check_name(field),)
    ]
    return results


def _noise_on_thin_data(check: str) -> bool:
    """Latency, success and cost ratios on thin data are noise; errors on thin data are errors."""
    return check in LATENCY_CHECKS or check in ("success_rate_ratio", "cost_per_success_ratio")


def with_parity(analysis: Analysis, diverging: list[str], tested: bool, enforce: bool) -> Analysis:
    """The analysis with the `parity` check: did the last applied `tidegate parity` run find a
    dedicated endpoint of the model diverging (`tested`: it judged one at all)? With
    `parity.enforce` a passing analysis then holds instead of stepping up (inconclusive, not
    a failure: the numbers are fine, the answers are not yet trusted); a failed one stays
    failed."""
    if not tested:
        return analysis
    check = Check("parity", FAIL if diverging else PASS, None, None, 0.0)
    found = replace(analysis, checks=(*analysis.checks, check))
    if not diverging or not enforce or analysis.verdict is not Verdict.PASS:
        return found
    reason = f"holds: parity: {', '.join(diverging)} diverges in the last parity run"
    return replace(found, verdict=Verdict.INCONCLUSIVE, reason=reason)
