"""Who sent what a route answered for: per caller (API key), counters on the route's shared
counts, `by:<caller>:n` (requests the route is answerable for), `:ok` (successes) and `:err`
(errors). Requests that are not the route's doing are not counted there (an answer cut by the
caller's own `max_tokens`, an upstream 4xx for the request itself, a client that left; see
router/request/bookkeeping.py). The canary weighs sides by these (router/canary/weights.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from router.state.latency import Counts

PREFIX = "by:"


@dataclass(frozen=True, slots=True)
class CallerCounts:
    requests: float = 0.0
    successes: float = 0.0
    errors: float = 0.0


def caller_fields(caller: str, *, ok: bool, error: bool) -> dict[str, float]:
    """The counters one answerable request adds on its route."""
    fields = {f"{PREFIX}{caller}:n": 1.0}
    if ok:
        fields[f"{PREFIX}{caller}:ok"] = 1.0
    if error:
        fields[f"{PREFIX}{caller}:err"] = 1.0
    return fields


def callers_of(totals: Iterable[Counts]) -> dict[str, CallerCounts]:
    """Per caller, its summed counts over the given routes' counters."""
    found: dict[str, dict[str, float]] = {}
    for counts in totals:
        for name, value in counts.items():
            if not name.startswith(PREFIX):
                continue
            caller, _, field = name[len(PREFIX) :].rpartition(":")
            entry = found.setdefault(caller, {})
            entry[field] = entry.get(field, 0.0) + value
    return {
        caller: CallerCounts(f.get("n", 0.0), f.get("ok", 0.0), f.get("err", 0.0))
        for caller, f in found.items()
        if f.get("n", 0.0) > 0
    }
