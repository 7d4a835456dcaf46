"""The state store's roles: what each part of the gateway asks of the shared state. A store
(router/state/memory/, router/state/redis/) is a short composition of one object per role,
`StateStore`: `store.leases`, `store.series`, `store.circuits`, ... A consumer takes the role
it uses (the dispatcher `store.leases`, the books `store.series`, ...); one that needs several
takes a protocol naming just those (router/canary/controller.py's `CanaryStore`).

Contract, for every implementation:
- `try_acquire(pool, slots, wait_s)` is atomic: no interleaving of calls, from any number
  of tasks, processes or replicas sharing the store, holds more than `slots.capacity` slots
  on `pool` at once (a lease holds `slots.weight` of them). Admission is FIFO: a caller never
  takes a slot ahead of a caller already waiting for that pool. With `wait_s == 0` it
  returns None at once when the pool is full; otherwise it waits in line up to `wait_s`
  seconds, then returns None; a line already `slots.max_waiters` long is not joined.
  Whatever ends an acquire (an error, a cancellation, a timeout on the client side of a
  store that still runs the call), no slot is left held by a token nobody knows.
- `release(lease)` is idempotent and never raises for a lease that is already gone; one the
  store cannot deliver now is retried until it lands or the lease would have expired.
- A lease's `prompt_tokens` count as the pool's pending prefill from its admission until
  `prefilled(lease)` (its first token) or its release, whichever comes first, and an acquire
  with `max_pending_tokens` admits only within it, atomically like the slots. No path (an
  error, a cancellation, an expired lease) leaves tokens pending for a lease nobody holds.
- `snapshot()` is cheap enough for every request (no I/O on the request path); its
  figures may lag the truth by the store's refresh interval.
- `observe` and `count` do no I/O: they are merged into the shared windows in the
  background (at least every second).
- Every other call that needs the shared store and cannot reach it raises StoreUnavailable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from policies.types import Snapshot
from router.periodic import Loops
from router.state.latency import Counts, Histogram, Metric
from router.state.members import Sighting
from router.state.quota import QuotaAnswer, QuotaAsk
from router.state.slots import Lease, Slots
from router.state.tasks import EarlyBound, Feedback, Settlement, TaskState


class StoreUnreachableAtStart(RuntimeError):
    """The shared store could not be reached when the gateway started (fail closed)."""


class Leases(Protocol):
    """Dedicated slots (with a named key's quota steps, the request path's only I/O with the store)."""

    async def try_acquire(self, pool: str, slots: Slots, wait_s: float = 0.0) -> Lease | None: ...

    async def release(self, lease: Lease) -> None: ...

    async def prefilled(self, lease: Lease) -> None:
        """The lease's request has its first token: its prompt tokens are no longer pending.
        Idempotent; never raises."""


class PrefillShare(Protocol):
    async def prefill_samples(
        self, pool: str, new: Sequence[tuple[float, float]], keep: int
    ) -> list[tuple[float, float]]:
        """Add this process's new (pending prompt tokens, TTFT ms) measurements of `pool` and
        return every process's latest `keep`, oldest first (router/signals/prefill.py)."""


class Samples(Protocol):
    """What happened, buffered in the process and merged into the shared windows later."""

    def observe(self, route: str, metric: Metric, value_ms: float) -> None: ...

    def count(self, route: str, counts: Mapping[str, float]) -> None:
        """Add to `route`'s counters."""


class Windows(Protocol):
    """The shared figures over a window, from every process."""

    async def counts_window(self, routes: Sequence[str], window_s: float) -> dict[str, Counts]:
        """Each route's summed counters over the last `window_s` seconds."""

    async def counts_series(
        self, routes: Sequence[str], window_s: float
    ) -> tuple[int, dict[str, list[tuple[int, Counts]]]]:
        """The window's counters per route in slices of its resolution (`resolution_for`):
        (the slice length, each route's [(slice start, counters)], oldest first)."""

    async def latency_window(
        self, routes: Sequence[str], metric: Metric, window_s: float
    ) -> dict[str, Histogram]:
        """Each route's merged histogram over the last `window_s` seconds."""


class Circuits(Protocol):
    async def trip(self, route: str, cooldown_s: float, max_cooldown_s: float) -> float:
        """Open (or extend) `route`'s circuit for every process: the n-th trip since the route
        last closed lasts min(max_cooldown_s, cooldown_s x 2^(n-1)), and never ends earlier
        than an earlier trip's cooldown. Returns the seconds until it ends."""

    async def reset_circuit(self, route: str) -> None:
        """Close `route`'s circuit (a trial request after the cooldown succeeded)."""


class Leadership(Protocol):
    async def lead(self, token: str, ttl_s: float, role: str = "canary") -> bool:
        """Take or renew the leader lease of `role` (the canary controller's, keep-warm's) for
        `ttl_s`; True while `token` holds it."""

    async def resign(self, token: str, role: str = "canary") -> None:
        """Give the lease up if `token` holds it (a clean shutdown hands over at once)."""


class CanaryRuns(Protocol):
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

    async def set_canary(self, model: str, percent: float) -> None:
        """Set a model's live canary percent for every process sharing the store."""

    async def clear_canary(self, model: str) -> None:
        """Drop a model's live canary percent: every process obeys its config file's again."""

    async def live_canary(self, model: str) -> float | None:
        """A model's live canary percent as the store holds it now (None: the file's), for an
        answer that must not lag as the snapshot may, by up to a refresh."""


class Rankings(Protocol):
    async def set_probe(self, model: str, ranking: bytes) -> None:
        """Keep a model's applied `tidegate probe` ranking (JSON) for every process: its
        endpoint order reaches the snapshot (router/state/rankings.py)."""

    async def probe(self, model: str) -> bytes | None:
        """The model's applied probe ranking (JSON), if any."""

    async def set_parity(self, model: str, verdicts: bytes) -> None:
        """Keep a model's applied `tidegate parity` verdicts (JSON) for every process: its
        diverging endpoints reach the snapshot (router/state/rankings.py)."""

    async def parity(self, model: str) -> bytes | None:
        """The model's applied parity verdicts (JSON), if any."""


class Quotas(Protocol):
    """Per-key limits and budgets, and the keys made through the admin API (router/state/quota.py)."""

    async def take_quota(self, ask: QuotaAsk) -> QuotaAnswer: ...

    async def settle_quota(self, ask: QuotaAsk, tokens: int, usd: float) -> None: ...

    async def spent(self, key: str, day: str, month: str) -> tuple[float, float]: ...

    async def put_key(self, name: str, entry: bytes, *, replacing: bytes | None = None) -> bool:
        """Store a made key's entry if the name's entry is still `replacing` (None: it has none):
        True, stored; False, another writer changed it first (nothing stored). Atomic."""

    async def made_keys(self) -> dict[str, bytes]: ...


class Spend(Protocol):
    async def try_spend(self, ledger: str, usd: float, cap_usd: float, ttl_s: float) -> bool:
        """Add `usd` to the shared `ledger` (kept `ttl_s` after its first spend) if it stays
        within `cap_usd`: True, spent; False, nothing added. Atomic across every process."""

    async def settle_spend(self, ledger: str, delta_usd: float) -> None:
        """Add `delta_usd` (negative: a reservation larger than what was spent) to a ledger
        that still exists; one that expired stays gone."""


class Tasks(Protocol):
    """Tasks and feedback (router/record/tasks.py); atomic per task across every process."""

    async def settle_task(self, settled: Settlement, ttl_s: float) -> TaskState:
        """Record that `settled.request` (of the task named `settled.task`, made by `owner`)
        ended on `route`, ok or not; the task's state before, `failed` including early failure
        feedback of its owner on the task or on this request. The task is ok now when `ok`
        and no feedback marked it failed. A settle of a request that arrived before the one the
        task is on (`started_ms`: settles of one task from several replicas arrive in any order)
        leaves the task where it is, marks only `failed`, and says `superseded`."""

    async def task_feedback(
        self, key: str, ok: bool, caller: str | None, ttl_s: float, early: EarlyBound
    ) -> Feedback:
        """Feedback from `caller` (None: the admin, who owns every task) on a request id or a
        task name. Applied only when `caller` owns the task; on a task not settled yet, the
        owner's failure is kept within `early` (success needs no keeping, the admin's none)."""


class Series(Samples, Windows, Protocol):
    """Samples and the windows over them: one role."""


class Lifecycle(Protocol):
    name: str
    loops: Loops  # its background loops' heartbeats (router/periodic.py)
    started_at: float  # when the gateway started using this store (Unix s): reports bill from it

    @property
    def degraded(self) -> bool:
        """True while shared state is unreachable and decisions are local."""

    @property
    def fallback_admissions(self) -> int:
        """Slots granted locally because the shared store was unreachable."""

    def snapshot(self) -> Snapshot: ...

    async def start(self) -> None:
        """Begin background work (refresh, renewal); called once by the app's lifespan."""

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...


class SharedLeases(Leases, PrefillShare, Protocol):
    """The leases role: slots, and the prefill samples every process shares."""


class StateStore(Lifecycle, Protocol):
    """Every role, one object each: what the app wires its parts with."""

    @property
    def leases(self) -> SharedLeases: ...

    @property
    def series(self) -> Series: ...

    @property
    def circuits(self) -> Circuits: ...

    @property
    def leadership(self) -> Leadership: ...

    @property
    def canary(self) -> CanaryRuns: ...

    @property
    def rankings(self) -> Rankings: ...

    @property
    def spend(self) -> Spend: ...

    @property
    def tasks(self) -> Tasks: ...

    @property
    def quotas(self) -> Quotas: ...

    @property
    def members(self) -> Members: ...


class Members(Protocol):
    """DNS pools' replicas on slot sets (router/fleet/), one assignment for every replica."""

    async def claim(self, sighting: Sighting) -> dict[int, str]:
        """Record that this gateway replica resolved `sighting.addresses` now, and return the
        pool's slot sets (index -> address) by router/state/members.py's `assign`, applied
        atomically across every process sharing the store, so each address is on one slot set
        everywhere. A slot set is freed only when no process has resolved its address for
        `forget_after_s` and it holds no lease."""
