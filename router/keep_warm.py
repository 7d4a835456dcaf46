"""Keep-warm: a scale-to-zero serverless route is cold exactly when a burst needs it, because
spills come in bursts and the provider idles past its timeout in between (the field notes'
bimodal cold-start tail). Per serverless endpoint with `keep_warm`, one gateway replica (the
holder of the `keep_warm` leader lease in the store) sends a `max_tokens: 1` request every
`interval_s` while `when` holds, up to `max_usd_per_day`.

The probes are spend, not traffic: they are counted on the route as `keep_warm` (requests,
`keep_warm_usd`, `keep_warm_failed`), never as requests, tasks or latency samples, so they
neither flatter the route's figures nor count as successes; the economics report shows their
cost.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import orjson

from policies.types import Snapshot, route_key
from router.config import GatewayConfig, KeepWarmConfig, ModelConfig, ServerlessEndpoint
from router.economics import token_cost_usd
from router.errors import StoreUnavailable, UpstreamFailure
from router.periodic import every, stop
from router.upstream import Upstream

log = logging.getLogger("tidegate.keep_warm")
ROLE = "keep_warm"
_DAY_S = 86400


class KeepWarmStore(Protocol):
    async def lead(self, token: str, ttl_s: float, role: str = "canary") -> bool: ...

    async def resign(self, token: str, role: str = "canary") -> None: ...

    def count(self, route: str, counts: Mapping[str, float]) -> None: ...


@dataclass(slots=True)
class _Route:
    model: str
    model_config: ModelConfig
    endpoint: ServerlessEndpoint
    warm: KeepWarmConfig
    last_sent: float = -1e18
    day: int = -1
    spent_usd: float = 0.0

    @property
    def key(self) -> str:
        return route_key(self.model, self.endpoint.name)

    @property
    def probe_usd(self) -> float:
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


WHEN: Mapping[str, Callable[[_Route, Snapshot], bool]] = {
    "always": lambda route, snapshot: True,
    "dedicated_busy": _busy,
}


class KeepWarm:
    def __init__(
        self,
        config: GatewayConfig,
        store: KeepWarmStore,
        upstream: Upstream,
        snapshot: Callable[[], Snapshot],
        leader_ttl_s: float,
    ) -> None:
        self._routes = [
            _Route(name, model, e, e.keep_warm)
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
        shortest = min((r.warm.interval_s for r in self._routes), default=1.0)
        self._tick_s = min(1.0, shortest / 4, leader_ttl_s / 3)

    @property
    def token(self) -> str:
        """This process's claim on the `keep_warm` leader lease."""
        return self._token

    def start(self) -> None:
        if self._routes:
            self._task = asyncio.get_running_loop().create_task(
                every(self._tick_s, self.tick, self._stop, survives=(StoreUnavailable,))
            )

    async def close(self) -> None:
        await stop(self._task, self._stop)
        for task in list(self._sends):
            task.cancel()
        await asyncio.gather(*self._sends, return_exceptions=True)
        if self._routes:
            await self._store.resign(self._token, ROLE)

    async def tick(self) -> None:
        """Send the probes that are due, if this replica leads."""
        if not await self._store.lead(self._token, self._ttl_s, ROLE):
            return
        now, wall, snapshot = time.monotonic(), time.time(), self._snapshot()
        for route in self._routes:
            if now - route.last_sent < route.warm.interval_s or not WHEN[route.warm.when](route, snapshot):
                continue
            day = int(wall // _DAY_S)
            if route.day != day:
                route.day, route.spent_usd = day, 0.0
            if route.spent_usd + route.probe_usd > route.warm.max_usd_per_day:
                continue  # the day's budget is spent
            route.last_sent = now
            route.spent_usd += route.probe_usd
            task = asyncio.get_running_loop().create_task(self._send(route))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)

    async def _send(self, route: _Route) -> None:
        body = orjson.dumps(
            {
                "model": route.endpoint.model,
                "messages": [{"role": "user", "content": "ping"}],
                "max_tokens": 1,
            }
        )
        ok = False
        try:
            response = await self._upstream.open(route.endpoint, "/chat/completions", body, ())
            try:
                await response.aread()
                ok = True
            finally:
                await response.aclose()
        except UpstreamFailure as exc:
            log.warning("keep-warm probe of %s failed: %s", route.key, exc)
        except Exception as exc:  # a probe never takes the loop down; its failure is counted
            log.warning("keep-warm probe of %s failed: %r", route.key, exc)
        self._store.count(
            route.key,
            {"keep_warm": 1.0, "keep_warm_usd": route.probe_usd, "keep_warm_failed": 0.0 if ok else 1.0},
        )
