"""What predicted-TTFT admission learns: per dedicated pool, TTFT = overhead + prompt tokens
waiting for prefill (its own included) / rate, fitted by least squares to the pool's measured
TTFTs against the pending prompt tokens each request was admitted behind; and the fit's error,
the 95th percentile of how far measured TTFTs ran over the line, which admission adds to every
prediction (measured through a real gateway, requests admitted at a prediction just under the
budget missed it by 80-320 ms: jitter the line does not see).

Until a pool has `min_samples` measurements it uses its configured prior (`prefill_tokens_per_s`,
`ttft_overhead_ms`). A fit that makes no physical sense (a rate at or under zero, a negative
overhead, prompts all the same size) keeps the prior's rate and refits the overhead alone.
Prompt tokens are the gateway's estimate from the request body (router/openai.py), so the
learned rate is in those units: the fit absorbs the estimate's bias.

Replicas learn one line: every `sync` pushes this process's new measurements to the state
store and fits to every process's latest `window` (one shared list per pool in Redis; the
memory store's is this process's). The pending tokens each measurement was taken against are
every process's too (the store's count). While the store is unreachable a process fits to its
own measurements and keeps the unshared ones (up to `window`) for the next sync.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Protocol

from policies.types import PrefillModel
from router.errors import StoreUnavailable

log = logging.getLogger("tidegate.prefill")


class SharedSamples(Protocol):
    """The state store as the learner uses it (router/state/roles.py)."""

    async def prefill_samples(
        self, pool: str, new: Sequence[tuple[float, float]], keep: int
    ) -> list[tuple[float, float]]: ...


_MIN_SPREAD = 1.5  # largest / smallest pending tokens before the slope is trusted
_ERROR_QUANTILE = 0.95  # the residual admission adds to the line (PrefillModel.error_ms)


class PrefillLearner:
    def __init__(self, priors: Mapping[str, PrefillModel], window: int = 512, min_samples: int = 20) -> None:
        self._priors = dict(priors)
        self._models: dict[str, PrefillModel] = dict(priors)
        self._samples: dict[str, deque[tuple[float, float]]] = {p: deque(maxlen=window) for p in priors}
        self._unshared: dict[str, deque[tuple[float, float]]] = {p: deque(maxlen=window) for p in priors}
        self._window = window
        self._min_samples = min_samples
        self._shared = True  # the last sync reached the store (for logging a change once)

    @property
    def models(self) -> Mapping[str, PrefillModel]:
        return self._models

    def sample(self, pool: str, pending_tokens: int, ttft_ms: float) -> None:
        samples = self._samples.get(pool)
        if samples is not None and pending_tokens > 0 and ttft_ms >= 0:
            samples.append((float(pending_tokens), ttft_ms))
            self._unshared[pool].append((float(pending_tokens), ttft_ms))

    async def sync(self, store: SharedSamples) -> None:
        """Share the new measurements and fit every pool to all processes' latest window."""
        try:
            for pool, unshared in self._unshared.items():
                merged = await store.prefill_samples(pool, list(unshared), self._window)
                unshared.clear()
                self._samples[pool] = deque(merged, maxlen=self._window)
        except StoreUnavailable as exc:
            if self._shared:
                log.warning("prefill model: learning from this process's TTFTs alone: %s", exc)
            self._shared = False
        else:
            if not self._shared:
                log.warning("prefill model: learning from every replica's TTFTs again")
            self._shared = True
        self.fit()

    def fit(self) -> None:
        """Refit every pool's model from its window (the signal loop calls it)."""
        self._models = {pool: self._fit(pool, samples) for pool, samples in self._samples.items()}

    def _fit(self, pool: str, samples: deque[tuple[float, float]]) -> PrefillModel:
        prior = self._priors[pool]
        n = len(samples)
        if n < self._min_samples:
            return prior
        line = _line(prior, samples)
        residuals = sorted(y - line.ttft_ms(x) for x, y in samples)
        error = max(0.0, residuals[int(_ERROR_QUANTILE * (n - 1))])
        return PrefillModel(line.tokens_per_s, line.overhead_ms, n, error)


def _line(prior: PrefillModel, samples: deque[tuple[float, float]]) -> PrefillModel:
    """Least squares through the samples; the prior's rate with the overhead refitted when the
    fit makes no physical sense."""
    n = len(samples)
    xs = [x for x, _ in samples]
    ys = [y for _, y in samples]
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if min(xs) > 0 and max(xs) / min(xs) >= _MIN_SPREAD and sxx > 0:
        slope = sum((x - mean_x) * (y - mean_y) for x, y in samples) / sxx  # ms per token
        intercept = mean_y - slope * mean_x
        if slope > 0 and intercept >= 0:
            return PrefillModel(1000.0 / slope, intercept, n)
    overhead = max(0.0, mean_y - 1000.0 * mean_x / prior.tokens_per_s)
    return PrefillModel(prior.tokens_per_s, overhead, n)
