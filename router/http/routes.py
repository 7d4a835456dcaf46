"""The routes beside the proxied ones: models, health, metrics. Thin."""

from __future__ import annotations

import time

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from router.config import GatewayConfig
from router.errors import ModelNotFound
from router.http.answers import JSON
from router.http.auth import ApiKeys
from router.state.roles import StateStore


def models_routes(config: GatewayConfig, keys: ApiKeys) -> list[Route]:
    """`GET /v1/models` and `GET /v1/models/{id}`: the configured model names, behind the
    client keys like every other `/v1` route (tools check a key by listing models)."""
    created = int(time.time())
    objects = {
        name: orjson.dumps({"id": name, "object": "model", "created": created, "owned_by": "tidegate"})
        for name in config.models
    }
    listing = b'{"object":"list","data":[' + b",".join(objects.values()) + b"]}"

    async def list_models(request: Request) -> Response:
        keys.check(request)
        return Response(listing, media_type=JSON)

    async def retrieve_model(request: Request) -> Response:
        keys.check(request)
        name = request.path_params["model"]
        found = objects.get(name)
        if found is None:
            raise ModelNotFound(f"The model `{name}` does not exist", param="model")
        return Response(found, media_type=JSON)

    return [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
    ]


def health_routes(store: StateStore, time_scale: float = 1.0) -> list[Route]:
    async def healthz(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type=JSON)

    async def readyz(request: Request) -> Response:
        """Ready while the gateway can serve, which it can without Redis (decisions are then
        local): an unreachable store is reported as `degraded`, still 200, so an orchestrator
        does not take every replica out of service because Redis blinked. Not ready (503) when
        a background loop has stopped completing its turns (router/periodic.py): this replica's
        view of the shared state is frozen then. Served from what the background loops last
        saw: no I/O, whoever asks and however often."""
        reachable = not store.degraded
        stale = store.loops.stale()
        body: dict[str, object] = {
            "status": "not_ready" if stale else "ready" if reachable else "degraded",
            "state_store": store.name,
            "state_store_reachable": reachable,
            "fallback_admissions": store.fallback_admissions,
            "time_scale": time_scale,  # not 1: a time-lapsed gateway, for `tidegate replay --speed`
        }
        if stale:
            body["stale_loops"] = stale
        return Response(orjson.dumps(body), status_code=503 if stale else 200, media_type=JSON)

    return [Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"])]


def metrics_route(registry: CollectorRegistry) -> Route:
    """Prometheus text exposition of this process's registry (see router/record/telemetry.py)."""

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Route("/metrics", metrics, methods=["GET"])
