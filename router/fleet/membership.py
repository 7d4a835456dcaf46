"""The live replicas of DNS pools. Every `discovery.refresh_s` each pool's name is resolved,
the addresses are claimed on the pool's slot sets in the state store (router/state/members.py:
an address keeps its slot set, so every gateway replica counts its leases on the same route),
and each model's endpoint list is rebuilt: a slot set is live while its address resolves here,
its `base_url` the replica's own. A replica that leaves takes no new request; its requests in
flight keep their lease on its slot set until they end, and the slot set goes to a new replica
only when no gateway replica has resolved the old one for `forget_after_s` and it holds no
lease. A slot set that changes address forgets what the placer believed its cache held.

Fail closed at start: a name whose resolver does not answer is an error naming its key. Later,
a resolver or store that fails keeps the last known members (logged), and the next turn tries
again: a DNS outage does not empty a pool that is serving."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from policies.types import Snapshot
from router.config.endpoints import DedicatedEndpoint, Endpoint
from router.config.gateway import ConfigError, GatewayConfig
from router.errors import StoreUnavailable
from router.fleet.resolve import ResolveFailed, Resolver
from router.periodic import Loops
from router.state.members import Sighting
from router.state.roles import Members

log = logging.getLogger("tidegate.fleet")


@dataclass(frozen=True)
class DnsPool:
    model: str
    name: str  # the entry's name; its slot sets are NAME-0, NAME-1, ...
    key: str  # where it is declared, for errors: models.M.dedicated[NAME].replica_dns
    host: str
    slots: tuple[DedicatedEndpoint, ...]


def dns_pools(config: GatewayConfig) -> tuple[DnsPool, ...]:
    found: dict[tuple[str, str], list[DedicatedEndpoint]] = {}
    for model_name, model in config.models.items():
        for d in model.dedicated:
            if d.replica_dns:
                found.setdefault((model_name, d.name.rpartition("-")[0]), []).append(d)
    return tuple(
        DnsPool(
            model,
            name,
            f"models.{model}.dedicated[{name}].replica_dns",
            urlsplit(slots[0].base_url).hostname or "",
            tuple(slots),
        )
        for (model, name), slots in found.items()
    )


def at_address(slot: DedicatedEndpoint, address: str) -> DedicatedEndpoint:
    """The slot set as the replica at `address`: the pool's URL with the address for its host."""
    parts = urlsplit(slot.base_url)
    host = f"[{address}]" if ":" in address else address
    netloc = f"{host}:{parts.port}" if parts.port else host
    return slot.model_copy(update={"base_url": urlunsplit(parts._replace(netloc=netloc))})


class Fleet:
    """Each model's endpoints as they are now (`endpoints(model)`): a model with no DNS pool
    gets its configured tuple."""

    def __init__(
        self,
        config: GatewayConfig,
        members: Members,
        snapshot: Callable[[], Snapshot],
        *,
        on_moved: Callable[[str, str], None] = lambda model, replica: None,
        loops: Loops | None = None,
    ) -> None:
        discovery = config.discovery
        self._config = config
        self._members, self._snapshot, self._on_moved = members, snapshot, on_moved
        self._loops = loops or Loops()
        self._resolver = Resolver(discovery.nameservers, discovery.timeout_s)
        self._refresh_s, self._forget_after_s = discovery.refresh_s, discovery.forget_after_s
        self._pools = dns_pools(config)
        self._live: dict[str, tuple[Endpoint, ...]] = {n: m.endpoints for n, m in config.models.items()}
        self._held: dict[str, dict[int, str]] = {}  # pool -> slot set -> address (the store's word)
        self._resolved: dict[str, tuple[str, ...]] = {}  # pool -> what its name resolved to here
        self._at: dict[str, DedicatedEndpoint] = {}  # slot set -> itself at its address now
        self._metrics: dict[str, str] = {}  # live slot set -> its pod's /metrics
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        for model in {p.model for p in self._pools}:
            self._rebuild(model)

    def endpoints(self, model: str) -> tuple[Endpoint, ...]:
        return self._live[model]

    def metrics_url(self, replica: str) -> str | None:
        """Where a live slot set's pod serves its engine's /metrics (its address, the
        engine_signal's path); None for a slot set with no pod, or not of a DNS pool."""
        return self._metrics.get(replica)

    def members(self) -> Mapping[str, Mapping[int, str]]:
        """Each DNS pool's slot sets live here (index -> address), for the admin API."""
        return {p.name: self._live_slots(p) for p in self._pools}

    async def start(self) -> None:
        if not self._pools or self._task is not None:
            return
        for pool in self._pools:
            try:
                self._resolved[pool.name] = await self._resolver.addresses(pool.host)
            except ResolveFailed as exc:
                raise ConfigError([f"{pool.key}: cannot resolve {pool.host} ({exc})"]) from None
            if not self._resolved[pool.name]:
                log.warning("%s: %s has no address yet (a pool scaled to zero?)", pool.key, pool.host)
        await self.refresh(resolve=False)
        self._task = asyncio.get_running_loop().create_task(
            self._loops.every("fleet refresh", self._refresh_s, self.refresh, self._stopping)
        )

    async def close(self) -> None:
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def refresh(self, resolve: bool = True) -> None:
        await asyncio.gather(*(self._refresh_pool(pool, resolve) for pool in self._pools))

    async def _refresh_pool(self, pool: DnsPool, resolve: bool) -> None:
        if resolve:
            try:
                self._resolved[pool.name] = await self._resolver.addresses(pool.host)
            except ResolveFailed as exc:
                log.warning("%s: %s; keeping the replicas last resolved", pool.key, exc)
        addresses = self._resolved.get(pool.name, ())
        snapshot = self._snapshot()
        busy = frozenset(
            i
            for i, slot in enumerate(pool.slots)
            if snapshot.in_flight.get(slot.name, 0) or snapshot.waiting.get(slot.name, 0)
        )
        sighting = Sighting(pool.name, addresses, len(pool.slots), busy, self._forget_after_s)
        try:
            held = await self._members.claim(sighting)
        except StoreUnavailable as exc:
            log.warning("%s: %s; keeping the slot sets last claimed", pool.key, exc)
            held = self._held.get(pool.name, {})
        before = self._held.get(pool.name, {})
        for slot, address in before.items():
            if held.get(slot) != address:
                self._on_moved(pool.model, pool.slots[slot].name)
        unplaced = set(addresses) - set(held.values())
        if unplaced:
            waiting = ", ".join(sorted(unplaced))
            log.warning("%s: no free slot set (max_replicas) for %s yet", pool.key, waiting)
        self._held[pool.name] = held
        self._rebuild(pool.model)

    def _live_slots(self, pool: DnsPool) -> dict[int, str]:
        resolved = set(self._resolved.get(pool.name, ()))
        return {i: a for i, a in sorted(self._held.get(pool.name, {}).items()) if a in resolved}

    def _rebuild(self, model: str) -> None:
        live: dict[str, DedicatedEndpoint] = {}
        for pool in self._pools:
            if pool.model == model:
                for slot in pool.slots:
                    self._metrics.pop(slot.name, None)
                for i, address in self._live_slots(pool).items():
                    slot = pool.slots[i]
                    found = self._at.get(slot.name)
                    if found is None or found.base_url != at_address(slot, address).base_url:
                        found = self._at[slot.name] = at_address(slot, address)
                    live[slot.name] = found
                    if slot.engine_signal is not None:
                        self._metrics[slot.name] = _metrics_at(found.base_url, slot.engine_signal.metrics_url)
        configured = self._config.models[model].endpoints
        self._live[model] = tuple(
            live.get(e.name, e)
            for e in configured
            if not (isinstance(e, DedicatedEndpoint) and e.replica_dns) or e.name in live
        )


def _metrics_at(base_url: str, metrics_url: str) -> str:
    here, there = urlsplit(base_url), urlsplit(metrics_url)
    return urlunsplit((here.scheme, here.netloc, there.path, there.query, ""))
