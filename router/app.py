"""`create_app(config, *, store, transport)`: the gateway as an ASGI app.

Dependencies are passed in (the store, the upstream transport, the recorder), so tests and
benchmarks build the same app with real or alternative parts. The lifespan closes what the
app opened: the upstream connection pools and the state store.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import ASGIApp

from policies import registry
from policies.base import Policy
from router.canary.controller import CanaryController, live_overrides
from router.config import ConfigError, GatewayConfig
from router.economics.costs import EconomicsGauges
from router.fleet.membership import Fleet
from router.http import proxy, routes
from router.http.admin import admin_router
from router.http.auth import ApiKeys, KeyDigests
from router.http.feedback import feedback_route
from router.http.handlers import install_error_handlers
from router.http.in_flight import InFlightLimit, RequestIds
from router.periodic import Loops
from router.record.records import Recorder
from router.record.tasks import TaskLedger
from router.record.telemetry import Telemetry, default_providers
from router.request.bookkeeping import Books
from router.request.breaker import Breakers, breaker_configs
from router.request.dispatch import Dispatcher
from router.request.placement import PlacementInputs
from router.request.quota import Quota
from router.request.upstream import TransportFactory, Upstream, aiohttp_transport
from router.signals.loop import Signals
from router.spill.keep_warm import KeepWarm
from router.spill.shadow import Shadow
from router.state.memory.store import MemoryStore
from router.state.roles import StateStore, StoreUnreachableAtStart
from router.state.tasks import EarlyBound

log = logging.getLogger("tidegate")


def build_policies(config: GatewayConfig) -> Mapping[str, Policy]:
    """One policy per model, by the name its config gives; unknown names are config errors."""
    policies: dict[str, Policy] = {}
    problems = []
    for name, model in config.models.items():
        try:
            policies[name] = registry.build(model.policy, model)
        except KeyError as exc:
            problems.append(f"models.{name}.policy: {exc.args[0]}")
    if problems:
        raise ConfigError(problems)
    return policies


def check_state(config: GatewayConfig) -> None:
    """The state section as start-up would read it, without connecting: a Redis URL that cannot
    be used (its scheme, an option, a TLS file) is a ConfigError naming `state.redis_url`."""
    state = config.state
    if not state.redis_url:
        if state.redis_password_file:
            raise ConfigError(["state.redis_password_file: set, but no state.redis_url uses it"])
        return
    from router.state.redis.address import BadRedisUrl  # noqa: PLC0415 (see _redis_store)
    from router.state.redis.clients import keyed, target_of  # noqa: PLC0415

    try:  # builds the client as start-up would, without connecting
        target_of(
            state.redis_url,
            cluster=state.redis_cluster,
            timeout_s=state.redis_timeout_s,
            client=state.redis_client,
            password_file=state.redis_password_file,
        )
    except BadRedisUrl as exc:
        raise ConfigError([keyed(exc)]) from None


def store_for(config: GatewayConfig, loops: Loops | None = None) -> StateStore:
    """The store the config asks for: Redis when `state.redis_url` is set, else in-memory."""
    state = config.state
    routes = config.route_keys()
    loops = loops or Loops()
    if not state.redis_url:
        return MemoryStore(
            routes,
            window_s=state.window_s,
            retention_s=state.retention_s,
            max_tasks=config.tasks.max_tracked,
            loops=loops,
        )
    return _redis_store(config, loops)


def _redis_store(config: GatewayConfig, loops: Loops) -> StateStore:
    """The Redis store, imported here: redis-py costs a process ~0.4 s of CPU to import, and a
    gateway on the memory store (the demo, one replica) never needs it."""
    from router.state.redis.store import RedisStore  # noqa: PLC0415

    state = config.state
    routes = config.route_keys()
    pools = [d.name for model in config.models.values() for d in model.dedicated]
    return RedisStore(
        state.redis_url,
        pools,
        routes=routes,
        lease_ttl_s=state.lease_ttl_s,
        window_s=state.window_s,
        retention_s=state.retention_s,
        fallback_share=state.fallback_share,
        cluster=state.redis_cluster,
        timeout_s=state.redis_timeout_s,
        client=state.redis_client,
        password_file=state.redis_password_file,
        start_degraded=state.start_degraded,
        loops=loops,
    )


@dataclass(frozen=True)
class Parts:
    """The gateway's parts, built once and wired by hand (router/app.py is the only place that
    knows them all); each part sees only the roles of the store it needs."""

    config: GatewayConfig
    store: StateStore
    upstream: Upstream
    telemetry: Telemetry
    recorder: Recorder
    signals: Signals
    ledger: TaskLedger
    gauges: EconomicsGauges
    controller: CanaryController
    keep_warm: KeepWarm
    shadow: Shadow
    dispatcher: Dispatcher
    keys: ApiKeys
    quota: Quota
    fleet: Fleet

    def background(self) -> tuple[Service, ...]:
        """What runs beside the requests, in start order (closed in reverse)."""
        return (self.keys, self.ledger, self.gauges, self.controller, self.keep_warm, self.shadow)


def build_parts(
    config: GatewayConfig,
    store: StateStore,
    transport: TransportFactory,
    recorder: Recorder | None,
    telemetry: Telemetry | None,
) -> Parts:
    endpoints = [e for model in config.models.values() for e in model.endpoints]
    candidates = [m.shadow.candidate for m in config.models.values() if m.shadow and m.shadow.candidate]
    upstream = Upstream([*endpoints, *candidates], transport)
    telemetry = telemetry or Telemetry(*default_providers())
    recorder = recorder or Recorder(sinks=[telemetry])
    loops = store.loops  # one set of heartbeats: the store's loops and every part's
    placement = PlacementInputs(config.models)

    def moved(model: str, replica: str) -> None:  # a DNS pool's slot set is another pod now
        placement.forget(model, replica)
        signals.forget(replica)

    fleet = Fleet(config, store.members, store.snapshot, on_moved=moved, loops=loops)
    signals = Signals(config, store, loops, metrics_url=fleet.metrics_url)
    telemetry.watch(signals.snapshot, store)
    early = EarlyBound(config.tasks.max_early_feedback, config.tasks.early_feedback_s)
    ledger = TaskLedger(
        store.tasks, store.series, config.tasks.ttl_s, on_settled=telemetry.task_settled, early=early
    )
    shadow = Shadow(config, store, upstream, telemetry.registry)
    quota = Quota(store.quotas, telemetry.registry)
    dispatcher = Dispatcher(
        config,
        store.leases,
        upstream,
        books=Books(
            store.series, recorder, recording=config.state.record, ledger=ledger, mirror=shadow, quota=quota
        ),
        policies=build_policies(config),
        signals=signals,
        breakers=Breakers(store.circuits, breaker_configs(config)),
        telemetry=telemetry,
        quota=quota,
        fleet=fleet,
        placement=placement,
    )
    return Parts(
        config,
        store,
        upstream,
        telemetry,
        recorder,
        signals,
        ledger,
        EconomicsGauges(config, store.series, telemetry.economics, loops),
        CanaryController(config, store, signals.snapshot, telemetry.registry, loops=loops),
        KeepWarm(config, store, upstream, signals.snapshot, config.state.leader_ttl_s, loops=loops),
        shadow,
        dispatcher,
        ApiKeys(config.auth, store.quotas, loops=loops, on_revoked=quota.forget),
        quota,
        fleet,
    )


def create_app(
    config: GatewayConfig,
    *,
    store: StateStore | None = None,
    transport: TransportFactory = aiohttp_transport,
    recorder: Recorder | None = None,
    telemetry: Telemetry | None = None,
) -> FastAPI:
    """`telemetry` defaults to OTLP export when the standard OTEL_* variables are set, and no
    tracing otherwise; `/metrics` serves its Prometheus registry either way."""
    parts = build_parts(config, store or store_for(config), transport, recorder, telemetry)
    app = GatewayApp(
        max_in_flight=config.limits.max_in_flight,
        title="tidegate",
        docs_url=None,
        redoc_url=None,
        lifespan=_lifespan(parts),
    )
    for name, value in (
        ("startup_error", None),
        ("config", config),
        ("recorder", parts.recorder),
        ("store", parts.store),
        ("signals", parts.signals),
        ("telemetry", parts.telemetry),
        ("ledger", parts.ledger),
        ("canary", parts.controller),
        ("keep_warm", parts.keep_warm),
        ("keys", parts.keys),
    ):
        setattr(app.state, name, value)
    _routes(app, parts)
    install_error_handlers(app)
    return app


def _lifespan(parts: Parts) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start the store (fail closed), then the signals and the background services; close them
    all, the store last, however serving ends."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await parts.store.start()
            log.info("%s", auth_mode(parts.config))
            for line in live_overrides(parts.config, parts.store.snapshot().canary_percent):
                log.warning("%s", line)
            await parts.fleet.start()  # DNS pools' first members, before a request can need them
            await parts.signals.start()
            for service in parts.background():
                service.start()
        except Exception as exc:  # any failure to start is the process's exit status, not a 0
            said = isinstance(exc, StoreUnreachableAtStart | ConfigError)  # the message is the whole story
            reason = str(exc) if said else f"{type(exc).__name__}: {exc}"
            log.error("tidegate cannot start: %s", reason, exc_info=not said)
            app.state.startup_error = reason
            for started in reversed(parts.background()):
                await started.close()
            await parts.signals.close()
            await parts.fleet.close()
            await parts.upstream.aclose()
            await parts.store.close()
            raise
        try:
            yield
        finally:
            for running in reversed(parts.background()):
                await running.close()
            await parts.signals.close()
            await parts.fleet.close()
            await parts.upstream.aclose()
            await parts.store.close()

    return lifespan


def _routes(app: GatewayApp, parts: Parts) -> None:
    config = parts.config
    for path in proxy.PROXIED_PATHS:
        endpoint = proxy.proxied_endpoint(path, parts.dispatcher, parts.keys, parts.quota, config.limits)
        app.lean["/v1" + path] = endpoint
        app.router.routes.append(Route("/v1" + path, endpoint, methods=["POST"]))  # other methods: 405
    app.router.routes.extend(routes.models_routes(config, parts.keys))
    admin = KeyDigests([config.auth.admin_key])
    app.router.routes.append(feedback_route(parts.ledger, parts.keys, admin, config.limits.body_timeout_s))
    app.router.routes.extend(routes.health_routes(parts.store, config.time_scale))
    metrics = routes.metrics_route(parts.telemetry.registry)
    if config.server.metrics_listen is None:
        app.router.routes.append(metrics)
    else:  # its own listener (router/cli/gateway.py serves it): not on the client port
        app.state.metrics_app = Starlette(routes=[metrics])
    app.include_router(
        admin_router(config, parts.store, parts.signals, parts.controller, parts.keys, fleet=parts.fleet)
    )


class Service(Protocol):
    def start(self) -> None: ...

    async def close(self) -> None: ...


class GatewayApp(FastAPI):
    """FastAPI for the admin, models and health routes, with the proxied paths served ahead
    of its middleware stack (proxy.LeanApi) and the in-flight limit outermost."""

    def __init__(self, *, max_in_flight: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lean: dict[str, proxy.Endpoint] = {}
        self._max_in_flight = max_in_flight

    def build_middleware_stack(self) -> ASGIApp:
        return InFlightLimit(
            proxy.LeanApi(RequestIds(super().build_middleware_stack()), self.lean), limit=self._max_in_flight
        )


def auth_mode(config: GatewayConfig) -> str:
    """One line for the start-up log: how clients and admins are let in."""
    auth = config.auth
    clients = (
        "OPEN to anyone (auth.allow_anonymous)" if auth.allow_anonymous else f"{len(auth.api_keys)} key(s)"
    )
    admin = "admin key set" if auth.admin_key else "admin API off (403: no auth.admin_key)"
    return f"auth: client API {clients}; {admin}"
