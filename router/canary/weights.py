"""A canary side's rates weighted by caller, so that no caller can steer the analysis.

From each caller's counts on a side (router/record/callers.py), a side's success and error
rates are:

- **like with like**: over the callers seen on both sides, when there are any (a caller
  whose traffic all landed on one side, by its `user` field, cannot be compared);
- **capped**: each caller weighs at most `max_share` of the side's samples (water-filling:
  the largest callers are scaled down to a common level); with too few callers for the cap
  (callers x max_share < 1), every caller's rate counts the same;
- **trimmed at both ends**: with at least `min_callers` (and 3) callers compared, the success
  rates leave out the caller for whom dedicated did worst against serverless and the one for
  whom it did best, and dedicated's error rate the caller with the most errors there and the
  one with the fewest. A caller can steer what it sends to each side (its `user` picks the
  bucket, its own schema or tools decide the success checks), so it can make one side look bad
  for itself, or good; whichever it does, it is the extreme caller that is left out, while a
  side that is worse (or as good) for everyone stays so without its two extremes. Ties at an
  end leave out the heaviest caller. Fewer callers than that: the plain rates, and the verdict
  says it rests on few.

Pure functions; the controller gathers the counts (router/canary/controller.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from router.record.callers import CallerCounts


@dataclass(frozen=True, slots=True)
class Rates:
    """A side's weighted figures (None: no samples)."""

    success_rate: float | None
    error_rate: float | None
    callers: int  # callers the rates rest on
    top_share: float | None  # the largest caller's share of the raw samples
    left_out: tuple[str, ...] = ()  # the extreme callers these rates were computed without


def capped_weights(sizes: Mapping[str, float], max_share: float) -> dict[str, float]:
    """Effective sizes e_c <= n_c with every e_c <= max_share x sum(e), each as large as it can
    be. With callers x max_share < 1 no such sizes exist: every caller then gets the same."""
    if not sizes:
        return {}
    if len(sizes) * max_share < 1:
        return dict.fromkeys(sizes, 1.0)
    ordered = sorted(sizes.values())
    total = sum(ordered)
    if ordered[-1] <= max_share * total:
        return dict(sizes)
    for capped in range(1, len(ordered)):  # the `capped` largest callers are held at `level`
        if max_share * capped >= 1:
            break
        rest = total - sum(ordered[len(ordered) - capped :])
        level = max_share * rest / (1 - max_share * capped)
        if ordered[len(ordered) - capped - 1] <= level <= ordered[len(ordered) - capped]:
            return {c: min(n, level) for c, n in sizes.items()}
    return dict.fromkeys(sizes, 1.0)


def rates(callers: Mapping[str, CallerCounts], max_share: float) -> Rates:
    """A side's success and error rates with each caller's weight capped."""
    sizes = {c: counts.requests for c, counts in callers.items()}
    weights = capped_weights(sizes, max_share)
    total = sum(weights.values())
    if total <= 0:
        return Rates(None, None, 0, None)
    ok = sum(weights[c] * callers[c].successes / callers[c].requests for c in weights)
    err = sum(weights[c] * callers[c].errors / callers[c].requests for c in weights)
    raw = sum(sizes.values())
    return Rates(ok / total, err / total, len(weights), max(sizes.values()) / raw)


def like_with_like(
    dedicated: Mapping[str, CallerCounts],
    serverless: Mapping[str, CallerCounts],
    max_share: float,
    min_callers: int = 3,
) -> tuple[Rates, Rates]:
    """Both sides' rates over the callers they share (all callers when they share none),
    trimmed at both ends when at least `min_callers` (and 3) are compared."""
    common = dedicated.keys() & serverless.keys()
    if common:
        dedicated = {c: dedicated[c] for c in common}
        serverless = {c: serverless[c] for c in common}
    ded, sl = rates(dedicated, max_share), rates(serverless, max_share)
    if len(common) < max(3, min_callers):
        return ded, sl
    gap = {
        c: _rate(dedicated[c].successes, dedicated[c]) - _rate(serverless[c].successes, serverless[c])
        for c in common
    }
    on_success = _ends(gap, dedicated)
    errors = {c: _rate(dedicated[c].errors, dedicated[c]) for c in common}
    on_errors = _ends(errors, dedicated)
    ded_ok, sl_ok = (
        rates(_but(dedicated, on_success), max_share),
        rates(_but(serverless, on_success), max_share),
    )
    ded_err = rates(_but(dedicated, on_errors), max_share)
    trimmed = tuple(sorted(set(on_success) | set(on_errors)))
    return (
        replace(ded, success_rate=ded_ok.success_rate, error_rate=ded_err.error_rate, left_out=trimmed),
        replace(sl, success_rate=sl_ok.success_rate, left_out=tuple(sorted(on_success))),
    )


def _rate(part: float, counts: CallerCounts) -> float:
    return part / counts.requests if counts.requests else 0.0


def _ends(values: Mapping[str, float], sizes: Mapping[str, CallerCounts]) -> set[str]:
    """The caller with the lowest value and the one with the highest (two different callers;
    at a tie, the heaviest)."""
    ordered = sorted(values, key=lambda c: (values[c], -sizes[c].requests, c))
    low = ordered[0]
    rest = [c for c in ordered if c != low]
    high = max(rest, key=lambda c: (values[c], sizes[c].requests, c))
    return {low, high}


def _but(callers: Mapping[str, CallerCounts], left_out: set[str]) -> dict[str, CallerCounts]:
    return {c: counts for c, counts in callers.items() if c not in left_out}
