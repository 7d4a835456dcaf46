"""Keep-warm: a scale-to-zero serverless route is cold exactly when a burst needs it, because
spills come in bursts and the provider idles past its timeout in between (the field notes'
bimodal cold-start tail). Per serverless endpoint with `keep_warm`, one gateway replica (the
holder of the `keep_warm` leader lease in the store) sends a `max_tokens: 1` request every
`interval_s` while `when` holds, up to `max_usd_per_day`.

The pings are spend, not traffic: they are counted on the route as `keep_warm` (requests,
`keep_warm_usd`, `keep_warm_failed`), never as requests, tasks or latency samples, so they
neither flatter the route's figures nor count as successes; the economics report shows their
cost.

`when: schedule` keeps a route warm in the UTC hours of the day in which its model spilled
(`schedule_min_spills` a day or more over `schedule_days`), read from the store's hourly
counters every 15 minutes by the leader; with no traffic recorded at all it keeps warm as
`always` would (nothing says when spills come).

`learn: true` takes the cold-start evidence of the pings themselves: a ping slower than
`cold_ms` (default 4 x the median of the route's last 20 pings, at least 1 s) found the route
cold, so the provider scaled it down within the gap since the previous ping (other traffic
in between could only have kept it warmer): the interval becomes half that gap, never under
`min_interval_s`. It only shrinks; a provider that became more patient costs a few pings.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from policies.base import Reason
from policies.types import Snapshot, route_key
from router.config import GatewayConfig, KeepWarmConfig, ModelConfig, ServerlessEndpoint
from router.economics.cost import token_cost_usd
from router.errors import StoreUnavailable, UpstreamFailure
from router.periodic import Loops, stop
from router.request.upstream import Upstream
from router.state.roles import Leadership, Series, Spend

log = logging.getLogger("tidegate.keep_warm")
ROLE = "keep_warm"
_DAY_S = 86400
_HOUR_S = 3600
SCHEDULE_REFRESH_S = 900.0
_SPILLS = tuple(f"reason:{r.value}" for r in Reason if r.is_spill)
_PINGS_KEPT = 20
_MIN_COLD_MS = 1000.0


class KeepWarmStore(Protocol):
    """The store's roles keep-warm uses (router/state/roles.py)."""

    @property
    def leadership(self) -> Leadership: ...

    @property
    def spend(self) -> Spend: ...

    @property
    def series(self) -> Series: ...


@dataclass(slots=True)
class _Route:
    model: str
    model_config: ModelConfig
    endpoint: ServerlessEndpoint
    warm: KeepWarmConfig
    interval_s: float = 0.0  # the configured one, or less once learned
    last_sent: float = -1e18
    hot_hours: frozenset[int] | None = None  # schedule: UTC hours to keep warm; None: no history
    schedule_at: float = -1e18  # when the schedule was last read
    pings_ms: deque[float] = field(default_factory=lambda: deque(maxlen=_PINGS_KEPT))

    @property
    def key(self) -> str:
        return route_key(self.model, self.endpoint.name)

    @property
    def ping_usd(self) -> float:
        e = self.endpoint
        return token_cost_usd(self.warm.prompt_tokens, 1, e.usd_per_mtok_in, e.usd_per_mtok_out)


def busy_share(model: ModelConfig, snapshot: Snapshot) -> float:
    """The share of the model's dedicated slots in use now (0 without dedicated)."""
    slots = sum(d.max_concurrency for d in model.dedicated)
    if slots == 0:
        return 0.0
    return sum(snapshot.in_flight.get(d.name, 0) for d in model.dedicated) / slots


def _busy(route: _Route, snapshot: Snapshot) -> bool:
    return busy_share(route.model_config, snapshot) >= route.warm.busy_above


def _scheduled(route: _Route, snapshot: Snapshot) -> bool:
    return route.hot_hours is None or time.gmtime().tm_hour in route.hot_hours


WHEN: Mapping[str, Callable[[_Route, Snapshot], bool]] = {
    "always": lambda route, snapshot: True,
    "dedicated_busy": _busy,
    "schedule": _scheduled,
}


def hot_hours(
    series: Mapping[str, Sequence[tuple[int, Mapping[str, float]]]], days: int, min_spills: float
) -> frozenset[int] | None:
    """The UTC hours of the day with at least `min_spills` spills a day, from hourly counters
    of a model's routes over `days`; None when no request at all was recorded."""
    spills = [0.0] * 24
    requests = 0.0
    for slices in series.values():
        for start, counts in slices:
            requests += counts.get("requests", 0.0)
            spills[(start // _HOUR_S) % 24] += sum(counts.get(k, 0.0) for k in _SPILLS)
    if requests == 0:
        return None
    return frozenset(hour for hour, n in enumerate(spills) if n / days >= min_spills)


class KeepWarm:
    def __init__(
        self,
        config: GatewayConfig,
        store: KeepWarmStore,
        upstream: Upstream,
        snapshot: Callable[[], Snapshot],
        leader_ttl_s: float,
        *,
        loops: Loops | None = None,
    ) -> None:
        self._loops = loops or Loops()
        self._routes = [
            _Route(name, model, e, e.keep_warm, e.keep_warm.interval_s)
            for name, model in config.models.items()
            for e in model.serverless
            if e.keep_warm is not None
        ]
        self._store = store
        self._upstream = upstream
        self._snapshot = snapshot
        self._ttl_s = leader_ttl_s
        self._token = uuid.uuid4().hex
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sends: set[asyncio.Task[None]] = set()
        self.pings_sent = 0  # by this process, since it started
        shortest = min(
            (r.warm.min_interval_s if r.warm.learn else r.warm.interval_s for r in self._routes), default=1.0
        )
        self._tick_s = min(1.0, shortest / 4, leader_ttl_s / 3)

    @property
    def token(self) -> str:
        """This process's claim on the `keep_warm` leader lease."""
        return self._token

    def intervals(self) -> dict[str, float]:
        """Each kept-warm route's interval now (learned ones may be shorter than configured)."""
        return {route.key: route.interval_s for route in self._routes}

    def schedules(self) -> dict[str, list[int] | None]:
        """Each scheduled route's UTC hours kept warm (None: no history yet, so always)."""
        return {
            route.key: None if route.hot_hours is None else sorted(route.hot_hours)
            for route in self._routes
            if route.warm.when == "schedule"
        }

    def start(self) -> None:
        if self._routes:
            self._task = asyncio.get_running_loop().create_task(
                self._loops.every(
                    "keep-warm", self._tick_s, self.tick, self._stop, survives=(StoreUnavailable,)
                )
            )

    async def close(self) -> None:
        await stop(self._task, self._stop)
        for task in list(self._sends):
            task.cancel()
        await asyncio.gather(*self._sends, return_exceptions=True)
        if self._routes:
            await self._store.leadership.resign(self._token, ROLE)

    async def tick(self) -> None:
        """Send the pings that are due, if this replica leads."""
        if not await self._store.leadership.lead(self._token, self._ttl_s, ROLE):
            return
        now, wall, snapshot = time.monotonic(), time.time(), self._snapshot()
        for route in self._routes:
            if route.warm.when == "schedule" and now - route.schedule_at >= SCHEDULE_REFRESH_S:
                await self._read_schedule(route, now)
            if now - route.last_sent < route.interval_s or not WHEN[route.warm.when](route, snapshot):
                continue
            ledger = f"keep_warm:{route.key}:{int(wall // _DAY_S)}"  # one per route and UTC day
            try:
                cap = route.warm.max_usd_per_day
                within = await self._store.spend.try_spend(ledger, route.ping_usd, cap, _DAY_S)
            except StoreUnavailable:
                within = False  # no ping whose spend cannot be counted
            if not within:
                continue  # the day's budget is spent, counted across replicas and leader changes
            gap = now - route.last_sent
            route.last_sent = now
            self.pings_sent += 1
            task = asyncio.get_running_loop().create_task(self._send(route, gap))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)

    async def _read_schedule(self, route: _Route, now: float) -> None:
        """The model's hourly spills over `schedule_days`, from every replica's counters."""
        routes = [route_key(route.model, e.name) for e in route.model_config.endpoints]
        _, series = await self._store.series.counts_series(routes, route.warm.schedule_days * _DAY_S)
        route.hot_hours = hot_hours(series, route.warm.schedule_days, route.warm.schedule_min_spills)
        route.schedule_at = now

    def _learn(self, route: _Route, ping_ms: float, gap_s: float) -> None:
        """A cold ping after `gap_s` idle: the provider's idle timeout is under the gap."""
        warm = route.warm
        earlier = list(route.pings_ms)
        route.pings_ms.append(ping_ms)
        if warm.cold_ms is not None:
            cold_ms = warm.cold_ms
        elif len(earlier) >= 5:
            cold_ms = max(_MIN_COLD_MS, 4 * statistics.median(earlier))
        else:
            return  # too few pings to tell a cold one from a slow provider
        if ping_ms <= cold_ms or gap_s <= 0 or gap_s > 1e9:
            return
        learned = max(warm.min_interval_s, gap_s / 2)
        if learned < route.interval_s:
            log.warning(
                "keep-warm: %s was cold after %.1f s idle: probing every %.1f s (was %.1f s)",
                route.key,
                gap_s,
                learned,
                route.interval_s,
            )
            route.interval_s = learned

    async def _send(self, route: _Route, gap_s: float) -> None:
        body = orjson.dumps(
            {
                "model": route.endpoint.model,
                "messages": [{"role": "user", "content": "ping"}],
                "max_tokens": 1,
            }
        )
        ok = False
        started = time.monotonic()
        try:
            response = await self._upstream.open(route.endpoint, "/chat/completions", body, ())
            try:
                await response.aread()
                ok = True
            finally:
                await response.aclose()
            if route.warm.learn:
                self._learn(route, (time.monotonic() - started) * 1000, gap_s)
        except UpstreamFailure as exc:
            log.warning("keep-warm ping of %s failed: %s", route.key, exc)
        except Exception as exc:  # a ping never takes the loop down; its failure is counted
            log.warning("keep-warm ping of %s failed: %r", route.key, exc)
        self._store.series.count(
            route.key,
            {"keep_warm": 1.0, "keep_warm_usd": route.ping_usd, "keep_warm_failed": 0.0 if ok else 1.0},
        )
