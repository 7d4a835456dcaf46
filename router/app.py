"""`create_app(config, *, store, transport)`: the gateway as an ASGI app.

Dependencies are passed in (the store, the upstream transport, the recorder), so tests and
benchmarks build the same app with real or alternative parts. The lifespan closes what the
app opened: the upstream connection pools and the state store.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from policies import registry
from policies.base import Policy
from router.canary.controller import CanaryController
from router.config import ConfigError, GatewayConfig
from router.economics.costs import EconomicsGauges
from router.errors import (
    INTERNAL_ERROR_MESSAGE,
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    RouteNotFound,
    error_body,
)
from router.http import api
from router.http.admin import admin_router
from router.http.auth import ApiKeys, KeyDigests
from router.http.feedback import feedback_route
from router.http.in_flight import InFlightLimit
from router.record.records import Recorder
from router.record.tasks import TaskLedger
from router.record.telemetry import Telemetry, default_providers
from router.request.bookkeeping import Books
from router.request.breaker import Breakers, breaker_configs
from router.request.dispatch import Dispatcher
from router.request.upstream import TransportFactory, Upstream, aiohttp_transport
from router.signals.loop import Signals
from router.spill.keep_warm import KeepWarm
from router.state.memory.store import MemoryStore
from router.state.redis.store import RedisStore
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


def store_for(config: GatewayConfig) -> StateStore:
    """The store the config asks for: Redis when `state.redis_url` is set, else in-memory."""
    state = config.state
    routes = config.route_keys()
    if not state.redis_url:
        return MemoryStore(
            routes, window_s=state.window_s, retention_s=state.retention_s, max_tasks=config.tasks.max_tracked
        )
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
        start_degraded=state.start_degraded,
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
    store = store or store_for(config)
    endpoints = [e for model in config.models.values() for e in model.endpoints]
    upstream = Upstream(endpoints, transport)
    telemetry = telemetry or Telemetry(*default_providers())
    recorder = recorder or Recorder(sinks=[telemetry])
    signals = Signals(config, store)
    telemetry.watch(signals.snapshot, store)
    early = EarlyBound(config.tasks.max_early_feedback, config.tasks.early_feedback_s)
    ledger = TaskLedger(store, config.tasks.ttl_s, on_settled=telemetry.task_settled, early=early)
    gauges = EconomicsGauges(config, store, telemetry.economics)
    controller = CanaryController(config, store, signals.snapshot, telemetry.registry)
    keep_warm = KeepWarm(config, store, upstream, signals.snapshot, config.state.leader_ttl_s)
    dispatcher = Dispatcher(
        config,
        store,
        upstream,
        books=Books(store, recorder, recording=config.state.record, ledger=ledger),
        policies=build_policies(config),
        signals=signals,
        breakers=Breakers(store, breaker_configs(config)),
        telemetry=telemetry,
    )
    keys = ApiKeys(config.auth.api_keys)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await store.start()
        except StoreUnreachableAtStart as exc:
            log.error("tidegate cannot start: %s", exc)
            app.state.startup_error = str(exc)
            await upstream.aclose()
            await store.close()
            raise
        log.info("%s", auth_mode(config))
        await signals.start()
        for service in (ledger, gauges, controller, keep_warm):
            service.start()
        try:
            yield
        finally:
            for running in (keep_warm, controller, gauges, signals, ledger):
                await running.close()
            await upstream.aclose()
            await store.close()

    app = GatewayApp(
        max_in_flight=config.limits.max_in_flight,
        title="tidegate",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    for name, value in (
        ("startup_error", None),
        ("config", config),
        ("recorder", recorder),
        ("store", store),
        ("signals", signals),
        ("telemetry", telemetry),
        ("ledger", ledger),
        ("canary", controller),
        ("keep_warm", keep_warm),
    ):
        setattr(app.state, name, value)
    for path in api.PROXIED_PATHS:
        endpoint = api.proxied_endpoint(path, dispatcher, keys, config.limits)
        app.lean["/v1" + path] = endpoint
        app.router.routes.append(Route("/v1" + path, endpoint, methods=["POST"]))  # other methods: 405
    app.router.routes.extend(api.models_routes(config, keys))
    admin = KeyDigests([config.auth.admin_key])
    app.router.routes.append(feedback_route(ledger, keys, admin, config.limits.body_timeout_s))
    app.router.routes.extend(api.health_routes(store, config.time_scale))
    app.router.routes.append(api.metrics_route(telemetry.registry))
    app.include_router(admin_router(config, store, signals, controller))
    _install_error_handlers(app)
    return app


class GatewayApp(FastAPI):
    """FastAPI for the admin, models and health routes, with the proxied paths served ahead
    of its middleware stack (api.LeanApi) and the in-flight limit outermost."""

    def __init__(self, *, max_in_flight: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lean: dict[str, api.Endpoint] = {}
        self._max_in_flight = max_in_flight

    def build_middleware_stack(self) -> ASGIApp:
        return InFlightLimit(
            api.LeanApi(super().build_middleware_stack(), self.lean), limit=self._max_in_flight
        )


def auth_mode(config: GatewayConfig) -> str:
    """One line for the start-up log: how clients and admins are let in."""
    auth = config.auth
    clients = (
        "OPEN to anyone (auth.allow_anonymous)" if auth.allow_anonymous else f"{len(auth.api_keys)} key(s)"
    )
    admin = "admin key set" if auth.admin_key else "admin API off (403: no auth.admin_key)"
    return f"auth: client API {clients}; {admin}"


def _install_error_handlers(app: FastAPI) -> None:
    async def gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return api.error_response(exc)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        error: GatewayError
        if exc.status_code == 405:
            error = MethodNotAllowed(f"Method {request.method} is not allowed on {request.url.path}")
        elif exc.status_code == 404:
            error = RouteNotFound(f"Unknown request URL: {request.method} {request.url.path}")
        else:
            return Response(
                error_body(str(exc.detail), "invalid_request_error", None, None),
                status_code=exc.status_code,
                media_type="application/json",
            )
        return await gateway_error(request, error)

    async def invalid_body(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"msg": "invalid request"}
        return await gateway_error(request, InvalidRequest(f"invalid request body: {first['msg']}"))

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return api.error_response(GatewayError(INTERNAL_ERROR_MESSAGE))

    app.add_exception_handler(GatewayError, gateway_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid_body)
    app.add_exception_handler(Exception, unexpected)
