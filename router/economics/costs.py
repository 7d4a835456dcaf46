"""Cost per route and per successful task over a window, the what-ifs and a recommendation,
from the shared counters (router/request/bookkeeping.py) and the cost model (router/economics/cost.py).

Per route:
- dedicated: provisioned cost (gpus x $/GPU-hour x replica-hours in the window, schedule
  included), utilization (busy slot-seconds / (max_concurrency x seconds)), the idle share of
  the cost, and the slot time spent on answers that did not succeed;
- serverless: the tokens it served at its prices (`tokens_estimated` counts answers without
  usage, whose output was counted from stream events), and what of it went to failures.
Successful tasks: `tasks_ok` (router/record/tasks.py). Cost per successful task = cost / tasks_ok.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from policies.types import route_key
from router.config import WEEKDAYS, DedicatedEndpoint, GatewayConfig, ModelConfig, ServerlessEndpoint
from router.economics.cost import (
    ScheduledReplicas,
    break_even_utilization,
    per_success,
    provisioned_cost_usd,
    replica_seconds,
    token_cost_usd,
)
from router.errors import StoreUnavailable
from router.periodic import Loops, stop
from router.state.latency import Counts

TARGET_UTILIZATION = 0.7  # sizing all-dedicated: replicas so the mean load is at most this busy


def _usd(value: float | None) -> float | None:
    return None if value is None else round(value, 10)


def schedule_of(endpoint: DedicatedEndpoint) -> list[ScheduledReplicas]:
    return [
        ScheduledReplicas(
            entry.seconds(entry.start),
            entry.seconds(entry.end),
            entry.replicas,
            frozenset(WEEKDAYS.index(d) for d in entry.days),
        )
        for entry in endpoint.schedule
    ]


def slots_per_replica(endpoint: DedicatedEndpoint) -> float:
    """`max_concurrency` is the endpoint's slots at its base replica count (one replica's with a
    base of 0), so a schedule that changes the count scales the slots with it."""
    return endpoint.max_concurrency / endpoint.replicas if endpoint.replicas > 0 else endpoint.max_concurrency


@dataclass(frozen=True, slots=True)
class Provisioned:
    """What a dedicated endpoint had in force over a window: replica-seconds, their price and
    the slot-seconds they offered (the denominator of utilization)."""

    replica_s: float
    cost_usd: float
    capacity_s: float


def provisioned(endpoint: DedicatedEndpoint, start_wall: float, end_wall: float) -> Provisioned:
    replica_s = replica_seconds(start_wall, end_wall, endpoint.replicas, schedule_of(endpoint))
    cost = provisioned_cost_usd(endpoint.gpus, endpoint.gpu_hour_usd, replica_s)
    return Provisioned(replica_s, cost, slots_per_replica(endpoint) * replica_s)


@dataclass(frozen=True, slots=True)
class Span:
    """The window as wall-clock Unix seconds."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 1e-9)


def route_costs(endpoint: DedicatedEndpoint | ServerlessEndpoint, c: Counts, span: Span) -> dict[str, Any]:
    tasks_ok = c.get("tasks_ok", 0.0)
    entry: dict[str, Any] = {
        "requests": int(c.get("requests", 0)),
        "tasks": round(c.get("tasks", 0.0)),
        "successful_tasks": round(tasks_ok),
        "successful_requests": int(c.get("ok", 0)),
        "failures": {
            k.removeprefix("fail:"): int(v) for k, v in sorted(c.items()) if k.startswith("fail:") and v
        },
        "feedback_failed": int(c.get("feedback_failed", 0)),
        "hedges": {
            "won": int(c.get("hedge_won", 0)),
            "lost": int(c.get("hedge_lost", 0)),
            "duplicate_tokens_in": int(c.get("hedge_tokens_in", 0)),
            "cost_usd": _usd(c.get("hedge_usd", 0.0)),
        },
    }
    if isinstance(endpoint, DedicatedEndpoint):
        paid = provisioned(endpoint, span.start, span.end)
        cost, capacity_s = paid.cost_usd, paid.capacity_s
        busy_s = c.get("busy_ms", 0.0) / 1000
        utilization = busy_s / capacity_s if capacity_s > 0 else 0.0
        wasted_s = c.get("wasted_busy_ms", 0.0) / 1000
        entry |= {
            "cost_usd": _usd(cost),
            "replica_hours": round(paid.replica_s / 3600, 4),
            "utilization": round(utilization, 4),
            "idle_cost_usd": _usd(cost * max(0.0, 1 - utilization)),
            "wasted_usd": _usd(cost * wasted_s / capacity_s if capacity_s > 0 else 0.0),
            "wasted_busy_s": round(wasted_s, 3),
        }
    else:
        # keep-warm pings and hedge losers' prompts are spend on the route, never requests or
        # tasks (router/spill/keep_warm.py, router/request/hedge.py)
        keep_warm_usd = c.get("keep_warm_usd", 0.0)
        cost = c.get("cost_usd", 0.0) + keep_warm_usd + c.get("hedge_usd", 0.0)
        entry |= {
            "cost_usd": _usd(cost),
            "wasted_usd": _usd(c.get("wasted_usd", 0.0)),
            "tokens_estimated_requests": int(c.get("tokens_estimated", 0)),
            "keep_warm": {
                "pings": int(c.get("keep_warm", 0)),
                "failed": int(c.get("keep_warm_failed", 0)),
                "cost_usd": _usd(keep_warm_usd),
            },
        }
    entry["cost_per_successful_task_usd"] = _usd(per_success(cost, tasks_ok))
    return entry


def model_costs(name: str, model: ModelConfig, counts: dict[str, Counts], span: Span) -> dict[str, Any]:
    """Per route, blended, the what-ifs and a recommendation for one model."""
    routes = {e.name: route_costs(e, counts.get(route_key(name, e.name), {}), span) for e in model.endpoints}
    unrouted = counts.get(route_key(name, "-"), {})
    total_cost = sum(r["cost_usd"] or 0.0 for r in routes.values())
    tasks_ok = sum(r["successful_tasks"] for r in routes.values())
    tasks = sum(r["tasks"] for r in routes.values()) + round(unrouted.get("tasks", 0.0))
    blended = {
        "cost_usd": _usd(total_cost),
        "tasks": tasks,
        "successful_tasks": tasks_ok,
        "cost_per_successful_task_usd": _usd(per_success(total_cost, tasks_ok)),
        "wasted_usd": _usd(sum(r["wasted_usd"] or 0.0 for r in routes.values())),
    }
    what_if = _what_if(name, model, counts, span, tasks_ok)
    return {
        "routes": routes,
        "blended": blended,
        "what_if": what_if,
        "recommendation": recommend(model, routes, blended, what_if),
    }


def _what_if(
    name: str, model: ModelConfig, counts: dict[str, Counts], span: Span, tasks_ok: int
) -> dict[str, Any]:
    tokens_in = sum(counts.get(route_key(name, e.name), {}).get("tokens_in", 0.0) for e in model.endpoints)
    tokens_out = sum(counts.get(route_key(name, e.name), {}).get("tokens_out", 0.0) for e in model.endpoints)
    busy_s = sum(counts.get(route_key(name, e.name), {}).get("busy_ms", 0.0) for e in model.endpoints) / 1000
    answer: dict[str, Any] = {
        "all_serverless_usd": None,
        "all_dedicated_usd": None,
        "break_even_utilization": None,
    }
    cheapest = min(
        model.serverless,
        key=lambda e: token_cost_usd(tokens_in, tokens_out, e.usd_per_mtok_in, e.usd_per_mtok_out),
        default=None,
    )
    serverless_per_task = None
    if cheapest is not None:
        all_serverless = token_cost_usd(
            tokens_in, tokens_out, cheapest.usd_per_mtok_in, cheapest.usd_per_mtok_out
        )
        answer["all_serverless_usd"] = _usd(all_serverless)
        answer["all_serverless_priced_at"] = cheapest.name
        serverless_per_task = per_success(all_serverless, tasks_ok)
    if model.dedicated:
        ded = model.dedicated[0]
        mean_concurrency = busy_s / span.seconds
        replicas = max(1, math.ceil(mean_concurrency / (ded.max_concurrency * TARGET_UTILIZATION)))
        hours = span.seconds / 3600
        answer["all_dedicated_usd"] = _usd(ded.gpus * ded.gpu_hour_usd * replicas * hours)
        answer["all_dedicated_replicas"] = replicas
        answer["mean_concurrency"] = round(mean_concurrency, 3)
        ded_counts = counts.get(route_key(name, ded.name), {})
        served = ded_counts.get("tasks_ok", 0.0)
        ded_busy_s = ded_counts.get("busy_ms", 0.0) / 1000
        if served > 0 and ded_busy_s > 0 and serverless_per_task:
            capacity_per_hour = ded.max_concurrency * 3600 / (ded_busy_s / served)
            answer["break_even_utilization"] = _rounded(
                break_even_utilization(ded.gpus * ded.gpu_hour_usd, capacity_per_hour, serverless_per_task)
            )
        answer["serverless_cost_per_successful_task_usd"] = _usd(serverless_per_task)
    return answer


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def recommend(
    model: ModelConfig, routes: dict[str, Any], blended: dict[str, Any], what_if: dict[str, Any]
) -> list[str]:
    """The field notes' reading, in their terms; each line gives its figures."""
    notes: list[str] = []
    break_even = what_if.get("break_even_utilization")
    serverless_per_task = what_if.get("serverless_cost_per_successful_task_usd")
    for endpoint in model.dedicated:
        route = routes[endpoint.name]
        utilization = route["utilization"]
        per_task = route["cost_per_successful_task_usd"]
        if route["requests"] == 0:
            notes.append(
                f"dedicated {endpoint.name} served no request in this window: "
                f"${route['cost_usd']:.4f} of idle capacity; scale it to zero or send it traffic"
            )
            continue
        if break_even is not None and break_even > 1 and per_task and serverless_per_task:
            notes.append(
                f"dedicated {endpoint.name} cannot beat serverless at this token mix even fully used "
                f"(break-even {break_even:.0%} utilization): ${per_task:.6f} per successful task vs "
                f"${serverless_per_task:.6f} on serverless; serve this model from serverless"
            )
        elif break_even is not None and utilization < break_even and per_task and serverless_per_task:
            notes.append(
                f"dedicated {endpoint.name} {utilization:.0%} utilized (break-even {break_even:.0%}): "
                f"${per_task:.6f} per successful task vs ${serverless_per_task:.6f} on serverless; "
                "shrink it or serve this model from serverless"
            )
        elif utilization >= 0.8 and (route.get("failures") or {}).get("NoCapacity", 0) == 0:
            notes.append(
                f"dedicated {endpoint.name} {utilization:.0%} utilized: if queue wait and the TTFT tail "
                "also rise, add a replica"
            )
        elif per_task and serverless_per_task and per_task < serverless_per_task:
            notes.append(
                f"dedicated {endpoint.name} is cheaper per successful task (${per_task:.6f} vs "
                f"${serverless_per_task:.6f}): move more baseline to it (raise the canary)"
            )
    if not notes and blended["tasks"]:
        notes.append("no change: the figures do not favour moving traffic")
    return notes


class CountWindows(Protocol):
    """A store's count windows; a store that cannot be read raises StoreUnavailable and no
    other error (tests/integration/test_store_away.py), which is all the gauges' loop survives."""

    async def counts_window(self, routes: Sequence[str], window_s: float) -> dict[str, Counts]: ...


async def dedicated_gauges(
    config: GatewayConfig, store: CountWindows, window_s: float
) -> dict[str, dict[str, float]]:
    """Per dedicated endpoint, over the last `window_s`: utilization, the replicas that would
    carry its demand (its own busy time plus the busy time of what spilled because it was
    full) at TARGET_UTILIZATION, and its price per hour now. For an autoscaler (KEDA, HPA on
    external metrics) through /metrics: every replica reports the same figures."""
    wall = time.time()
    counts = await store.counts_window(config.route_keys(), window_s)
    demand_s: dict[str, float] = {}
    endpoints: dict[str, DedicatedEndpoint] = {}
    for name, model in config.models.items():
        spilled_s = 0.0
        for spill in model.serverless:
            c = counts.get(route_key(name, spill.name), {})
            requests = c.get("requests", 0.0)
            if requests:
                spilled_s += c.get("busy_ms", 0.0) / 1000 * c.get("reason:saturated", 0.0) / requests
        for i, dedicated in enumerate(model.dedicated):
            endpoints[dedicated.name] = dedicated
            busy = counts.get(route_key(name, dedicated.name), {}).get("busy_ms", 0.0) / 1000
            demand_s[dedicated.name] = (
                demand_s.get(dedicated.name, 0.0) + busy + (spilled_s if i == 0 else 0.0)
            )
    gauges: dict[str, dict[str, float]] = {}
    for pool, endpoint in endpoints.items():
        capacity_s = provisioned(endpoint, wall - window_s, wall).capacity_s
        busy = sum(
            counts.get(route_key(name, pool), {}).get("busy_ms", 0.0) / 1000
            for name, model in config.models.items()
            if any(d.name == pool for d in model.dedicated)
        )
        replicas_now = replica_seconds(wall, wall + 1, endpoint.replicas, schedule_of(endpoint))
        demand = demand_s[pool] / window_s
        gauges[pool] = {
            "utilization": round(busy / capacity_s, 4) if capacity_s > 0 else 0.0,
            "desired_replicas": float(math.ceil(demand / (slots_per_replica(endpoint) * TARGET_UTILIZATION))),
            "usd_per_hour": endpoint.gpus * endpoint.gpu_hour_usd * replicas_now,
        }
    return gauges | dns_pool_gauges(config, demand_s, window_s)


def dns_pool_gauges(
    config: GatewayConfig, demand_s: Mapping[str, float], window_s: float
) -> dict[str, dict[str, float]]:
    """A pool found by DNS, under its entry's name: the replicas its slot sets' demand needs at
    TARGET_UTILIZATION, at most `max_replicas` (what KEDA scales the pool's Deployment by)."""
    pools: dict[str, list[DedicatedEndpoint]] = {}
    for model in config.models.values():
        for d in model.dedicated:
            if d.replica_dns:
                pools.setdefault(d.name.rpartition("-")[0], []).append(d)
    gauges = {}
    for pool, slots in pools.items():
        demand = sum(demand_s.get(s.name, 0.0) for s in slots) / window_s
        wanted = math.ceil(demand / (slots[0].max_concurrency * TARGET_UTILIZATION))
        gauges[pool] = {"desired_replicas": float(min(wanted, slots[0].max_replicas or len(slots)))}
    return gauges


GAUGES_REFRESH_S = 15.0  # the dedicated pools' gauges on /metrics are recomputed this often
GAUGES_WINDOW_S = 300.0  # ... over this window


class EconomicsGauges:
    """Keeps `into` (Telemetry.economics) filled with `dedicated_gauges`, in the background."""

    def __init__(
        self,
        config: GatewayConfig,
        store: CountWindows,
        into: dict[str, dict[str, float]],
        loops: Loops | None = None,
    ) -> None:
        self._config = config
        self._loops = loops or Loops()
        self._store = store
        self._into = into
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        gauges = await dedicated_gauges(self._config, self._store, GAUGES_WINDOW_S)
        self._into.clear()
        self._into.update(gauges)

    def start(self) -> None:
        if self._task is None and self._config.state.record:
            survives = (StoreUnavailable,)  # the store away: the gauges keep their last values
            self._task = asyncio.get_running_loop().create_task(
                self._loops.every(
                    "economics gauges", GAUGES_REFRESH_S, self.refresh, self._stop, survives=survives
                )
            )

    async def close(self) -> None:
        await stop(self._task, self._stop)
        self._task = None
