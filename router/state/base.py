"""The state-store seam: admission slots on dedicated pools and the snapshot policies read.

Contract, for every implementation:
- `try_acquire(pool, slots, wait_s)` is atomic: no interleaving of calls, from any number
  of tasks, processes or replicas sharing the store, holds more than `slots.capacity` slots
  on `pool` at once (a lease holds `slots.weight` of them). Admission is FIFO: a caller never
  takes a slot ahead of a caller already waiting for that pool. With `wait_s == 0` it
  returns None at once when the pool is full; otherwise it waits in line up to `wait_s`
  seconds, then returns None; a line already `slots.max_waiters` long is not joined.
  Whatever ends an acquire (an error, a cancellation, a timeout on the client side of a
  store that still runs the call), no slot is left held by a token nobody knows.
- `release(lease)` is idempotent and never raises for a lease that is already gone.
- A lease's `prompt_tokens` count as the pool's pending prefill from its admission until
  `prefilled(lease)` (its first token) or its release, whichever comes first, and an acquire
  with `max_pending_tokens` admits only within it, atomically like the slots. No path (an
  error, a cancellation, an expired lease) leaves tokens pending for a lease nobody holds.
- `snapshot()` is cheap enough for every request (no I/O on the request path); its
  figures may lag the truth by the store's refresh interval.
- `observe(route, metric, value_ms)` does no I/O: samples are merged into the shared latency
  histograms in the background (at least every second).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from policies.types import Snapshot
from router.state.latency import Counts, Histogram, Metric
from router.tasks import EarlyBound, Feedback, Settlement, TaskState


class StoreUnreachableAtStart(RuntimeError):
    """The shared store could not be reached when the gateway started (fail closed)."""


@dataclass(frozen=True, slots=True)
class Slots:
    """What an acquire asks of a pool: `capacity` slots in all, `weight` of them for this
    request (its `n`/`best_of` engine sequences), and a line of at most `max_waiters`."""

    capacity: int
    weight: int = 1
    max_waiters: int = 64
    # predicted-TTFT admission: this request's prompt tokens, counted as pending prefill on the
    # pool until its first token; admitted only while the pool's pending tokens with these stay
    # within `max_pending_tokens` (or the pool has none pending: a lone prompt always fits)
    prompt_tokens: int = 0
    max_pending_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    """One admitted request's `weight` slots on a dedicated pool."""

    pool: str
    token: str
    weight: int = 1
    prompt_tokens: int = 0  # pending prefill on the pool until `prefilled` or `release`
    pending_at_admit: int = 0  # the pool's pending prompt tokens right after this admission


def members(token: str, weight: int) -> list[str]:
    """The slot members a lease of `weight` holds under `token` (the token itself first)."""
    return [token, *(f"{token}#{i}" for i in range(2, weight + 1))]


def probe_order(ranking: bytes) -> tuple[str, ...]:
    """The endpoint names of an applied probe ranking, fastest first."""
    import orjson  # noqa: PLC0415

    try:
        found = orjson.loads(ranking)
        return tuple(str(e["endpoint"]) for e in found.get("ranking", ()))
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
        return ()


class StateStore(Protocol):
    name: str
    degraded: bool  # True while shared state is unreachable and decisions are local
    fallback_admissions: int  # slots granted locally because the shared store was unreachable

    async def try_acquire(self, pool: str, slots: Slots, wait_s: float = 0.0) -> Lease | None: ...

    async def release(self, lease: Lease) -> None: ...

    async def prefilled(self, lease: Lease) -> None:
        """The lease's request has its first token: its prompt tokens are no longer pending.
        Idempotent; never raises."""

    async def prefill_samples(
        self, pool: str, new: Sequence[tuple[float, float]], keep: int
    ) -> list[tuple[float, float]]:
        """Add this process's new (pending prompt tokens, TTFT ms) measurements of `pool` and
        return every process's latest `keep`, oldest first (predicted-TTFT admission learns
        its prefill model from them, router/prefill.py). Raises StoreUnavailable."""
        ...

    def observe(self, route: str, metric: Metric, value_ms: float) -> None: ...

    def count(self, route: str, counts: Mapping[str, float]) -> None:
        """Add to `route`'s counters (no I/O; merged in the background like `observe`)."""

    async def counts_window(self, routes: Sequence[str], window_s: float) -> dict[str, Counts]:
        """Each route's summed counters over the last `window_s` seconds, from every process."""

    async def counts_series(
        self, routes: Sequence[str], window_s: float
    ) -> tuple[int, dict[str, list[tuple[int, Counts]]]]:
        """The window's counters per route in slices of its resolution (`resolution_for`):
        (the slice length, each route's [(slice start, counters)], oldest first)."""

    async def trip(self, route: str, cooldown_s: float, max_cooldown_s: float) -> float:
        """Open (or extend) `route`'s circuit for every process: the n-th trip since the route
        last closed lasts min(max_cooldown_s, cooldown_s x 2^(n-1)), and never ends earlier
        than an earlier trip's cooldown. Returns the seconds until it ends. StoreUnavailable
        when the shared store cannot be reached."""

    async def reset_circuit(self, route: str) -> None:
        """Close `route`'s circuit (a probe after the cooldown succeeded). StoreUnavailable when
        the shared store cannot be reached."""

    async def latency_window(
        self, routes: Sequence[str], metric: Metric, window_s: float
    ) -> dict[str, Histogram]:
        """Each route's merged histogram over the last `window_s` seconds, from every process."""

    def snapshot(self) -> Snapshot: ...

    async def try_spend(self, ledger: str, usd: float, cap_usd: float, ttl_s: float) -> bool:
        """Add `usd` to the shared `ledger` (kept `ttl_s` after its first spend) if it stays
        within `cap_usd`: True, spent; False, nothing added. Atomic across every process;
        StoreUnavailable when the shared store cannot be reached (spend nothing then)."""

    async def settle_task(self, settled: Settlement, ttl_s: float) -> TaskState:
        """See router/tasks.py (TaskStore): atomic per task across every process."""

    async def task_feedback(
        self, key: str, ok: bool, caller: str | None, ttl_s: float, early: EarlyBound
    ) -> Feedback:
        """See router/tasks.py (TaskStore). StoreUnavailable when the shared store cannot be
        reached."""

    async def lead(self, token: str, ttl_s: float, role: str = "canary") -> bool:
        """Take or renew the leader lease of `role` (the canary controller's, keep-warm's) for
        `ttl_s`; True while `token` holds it. StoreUnavailable when the store is away."""

    async def resign(self, token: str, role: str = "canary") -> None:
        """Give the lease up if `token` holds it (a clean shutdown hands over at once)."""

    async def canary_run(self, model: str) -> tuple[int, bytes | None]:
        """A model's canary run (JSON, None if never started) and its version."""

    async def canary_history(self, model: str, limit: int) -> list[bytes]:
        """The newest `limit` events of a model's canary history (JSON), newest first."""

    async def write_canary(
        self, model: str, run: bytes, event: bytes | None, *, version: int, leader: str | None, history: int
    ) -> int:
        """Replace the run if it is still at `version` and, with `leader`, while that token
        leads; add `event` to the history (kept to `history` events). The new version; 0 when
        fenced out; -1 when the run changed since it was read."""

    async def set_probe(self, model: str, ranking: bytes) -> None:
        """Keep a model's applied probe ranking (JSON) for every process: its endpoint order
        reaches the snapshot (`probe_order`). StoreUnavailable when the store is away."""

    async def probe(self, model: str) -> bytes | None:
        """The model's applied probe ranking (JSON), if any."""

    async def set_canary(self, model: str, percent: float) -> None:
        """Set a model's live canary percent for every process sharing the store."""

    async def start(self) -> None:
        """Begin background work (refresh, renewal); called once by the app's lifespan."""

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
