"""A canary side's rates weighted by caller, so that no caller can steer the analysis.

From each caller's counts on a side (router/record/callers.py), a side's success and error
rates are:

- **like with like**: over the callers seen on both sides, when there are any (a caller
  whose traffic all landed on one side, by its `user` field, cannot be compared);
- **capped**: each caller weighs at most `max_share` of the side's samples (water-filling:
  the largest callers are scaled down to a common level); with too few callers for the cap
  (callers x max_share < 1), every caller's rate counts the same.

Pure functions; the controller gathers the counts (router/canary/controller.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from router.record.callers import CallerCounts


@dataclass(frozen=True, slots=True)
class Rates:
    """A side's weighted figures (None: no samples)."""

    success_rate: float | None
    error_rate: float | None
    callers: int  # callers the rates rest on
    top_share: float | None  # the largest caller's share of the raw samples


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
    dedicated: Mapping[str, CallerCounts], serverless: Mapping[str, CallerCounts], max_share: float
) -> tuple[Rates, Rates]:
    """Both sides' rates over the callers they share (all callers when they share none)."""
    common = dedicated.keys() & serverless.keys()
    if common:
        dedicated = {c: dedicated[c] for c in common}
        serverless = {c: serverless[c] for c in common}
    return rates(dedicated, max_share), rates(serverless, max_share)
