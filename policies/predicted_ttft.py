"""Predicted-TTFT admission: a dedicated replica's capacity is prefill tokens per second, not
sequences. Admit to a dedicated pool while the TTFT predicted there, from the prompt tokens
already admitted and not yet at their first token (this request's included) and the pool's
learned prefill model, fits the model's TTFT budget; otherwise spill at once. Never wait and
then spill anyway.

A request predicted over the budget on every pool misses its SLO there for certain, and, worse,
its prompt sits in the pool's prefill queue ahead of every later request, so the pool's next
requests miss too; spilling is its only chance. (The rule used to keep it on the pool when the
spill route's windowed median TTFT was slower. After a scale-to-zero route's cold load that
median is the load for a whole window while the route is warm again: on the held-out Azure code
slices the policy then admitted worse than a fixed cap of 8 slots (issue 28). Spilling at once
beat every fixed cap there, cold route or warm.)

`max_concurrency` stays a hard ceiling (the engine's `max_num_seqs`), not the steering signal.
The prediction is a function of the snapshot; the store enforces it atomically at acquire
(`Decision.admit_within`), so a burst that arrives between two snapshots cannot overfill the
prefill queue.

With a pool's engine signal, the tokens ahead are the larger of the store's count (tidegate's
admitted requests, every replica's) and the engine's own queue (its waiting requests, sized
by its mean prompt): load from clients that bypass tidegate counts too, and the store's bound
shrinks by what the engine holds beyond tidegate's count."""

from __future__ import annotations

from enum import StrEnum

from policies.base import Decision, Reason, RequestContext
from policies.types import Snapshot, T, is_dedicated


class Admission(StrEnum):
    SLOTS = "slots"  # a dedicated pool admits while it has a free slot (max_concurrency)
    PREDICTED_TTFT = "predicted_ttft"  # ... while the TTFT predicted there fits slo.ttft_budget_ms


def tokens_ahead(snapshot: Snapshot, pool: str, prompt_tokens: int) -> float:
    """Prompt tokens waiting for prefill on `pool`: the store's count, or the engine's queue
    when that says more (clients that bypass tidegate)."""
    pending = float(snapshot.pending_prompt_tokens.get(pool, 0))
    queue = snapshot.engine_queue.get(pool)
    return pending if queue is None else max(pending, queue.prompt_tokens(prompt_tokens))


def predicted_ttft_ms(snapshot: Snapshot, pool: str, prompt_tokens: int) -> float | None:
    """The TTFT a request of `prompt_tokens` would see on `pool` now, with the model's measured
    error added (its p95, not its mean); None without a model."""
    model = snapshot.prefill.get(pool)
    if model is None:
        return None
    return model.ttft_p95_ms(tokens_ahead(snapshot, pool, prompt_tokens) + prompt_tokens)


class PredictedTtftFirst:
    """Dedicated endpoints whose predicted TTFT fits `budget_ms`, then serverless."""

    def __init__(self, budget_ms: float) -> None:
        self._budget_ms = budget_ms

    def decide(self, context: RequestContext, snapshot: Snapshot, candidates: tuple[T, ...]) -> Decision[T]:
        dedicated = [c for c in candidates if is_dedicated(c)]
        serverless = tuple(c for c in candidates if not is_dedicated(c))
        if not dedicated:
            return Decision(serverless, Reason.SERVERLESS_ONLY)
        open_ = [d for d in dedicated if snapshot.in_flight.get(d.name, 0) < (d.max_concurrency or 0)]
        if not open_:  # the hard ceiling: every engine slot is taken
            return Decision(serverless or tuple(dedicated), Reason.SATURATED)
        predicted = {d.name: predicted_ttft_ms(snapshot, d.name, context.prompt_tokens) for d in open_}
        fits = [d for d in open_ if (predicted[d.name] or 0.0) <= self._budget_ms]
        if fits:
            within = {
                d.name: _store_bound(snapshot, d.name, context.prompt_tokens, self._budget_ms)
                for d in fits
                if d.name in snapshot.prefill
            }
            return Decision((*fits, *serverless), Reason.BASELINE, admit_within=within)
        if not serverless:  # nowhere to spill: the quickest pool, over budget
            return Decision((min(open_, key=lambda d: predicted[d.name] or 0.0),), Reason.SATURATED)
        return Decision(serverless, Reason.PREDICTED_SLOW)


def _store_bound(snapshot: Snapshot, pool: str, prompt_tokens: int, budget_ms: float) -> int:
    """The most tidegate-admitted tokens the store may let wait on `pool`: the budget's, less
    what the engine holds beyond the store's own count."""
    beyond = tokens_ahead(snapshot, pool, prompt_tokens) - snapshot.pending_prompt_tokens.get(pool, 0)
    return max(0, snapshot.prefill[pool].tokens_within(budget_ms) - int(beyond))
