"""The admin API: a model's configuration and live state, and its canary percent.

Every route needs `Authorization: Bearer <auth.admin_key>`; with no admin key configured
the admin API answers 403. Upstream API keys never appear in its output.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request

from policies.base import RequestContext
from policies.serverless import FastestServerless, ServerlessOrder
from policies.types import Snapshot, route_key
from router.canary.controller import ACTIONS, HISTORY, CanaryController
from router.config import GatewayConfig, LimitsConfig, ModelConfig
from router.economics.report import economics_report
from router.economics.routes_report import figures_json, parse_window, routes_report
from router.errors import ClientError, InvalidRequest, ModelNotFound, Unauthorized
from router.http.api import read_body
from router.http.auth import KeyDigests, bearer_token
from router.openai import json_object
from router.signals.loop import Signals
from router.state.roles import StateStore


class AdminDisabled(ClientError):
    status = 403
    code = "admin_disabled"


def admin_router(
    config: GatewayConfig, store: StateStore, signals: Signals, canary: CanaryController
) -> APIRouter:
    admin_key = KeyDigests([config.auth.admin_key])

    def require_admin(request: Request) -> None:
        if not admin_key:
            raise AdminDisabled("The admin API is disabled: set auth.admin_key to enable it.")
        token = bearer_token(request)
        if token is None or not admin_key.accepts(token):
            raise Unauthorized("A valid admin key is required: 'Authorization: Bearer ADMIN_KEY'.")

    router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])

    def model_config(model: str) -> ModelConfig:
        found = config.models.get(model)
        if found is None:
            raise ModelNotFound(f"The model `{model}` is not configured", param="model")
        return found

    async def describe(model: str) -> dict[str, Any]:
        cfg = model_config(model)
        snapshot = signals.snapshot()
        probed = await store.probe(model)
        return {
            "model": model,
            "canary_percent": snapshot.canary_percent.get(model, cfg.canary_percent),
            "configured_canary_percent": cfg.canary_percent,
            "config": cfg.model_dump(mode="json", exclude=_SECRETS),
            "dedicated": [
                {
                    "name": d.name,
                    "max_concurrency": d.max_concurrency,
                    "in_flight": snapshot.in_flight.get(d.name, 0),
                    "waiting": snapshot.waiting.get(d.name, 0),
                    "queue_depth": snapshot.queue_depth(d.name),
                    "slo_breached": route_key(model, d.name) in snapshot.slo_breached,
                    "engine_saturated": d.name in snapshot.engine_saturated,
                }
                for d in cfg.dedicated
            ],
            "routes": {
                e.name: {
                    "kind": e.kind.value,
                    "circuit": _circuit(snapshot, route_key(model, e.name)),
                    "ttft_ms": figures_json(snapshot.ttft.get(route_key(model, e.name))),
                    "e2e_ms": figures_json(snapshot.e2e.get(route_key(model, e.name))),
                }
                for e in cfg.endpoints
            },
            "serverless_order": serverless_order(model, cfg, snapshot),
            "probe": _probe_view(probed),
            "window_s": config.state.window_s,
            "state_store": store.name,
        }

    def window_of(window: str) -> float:
        try:
            window_s = parse_window(window)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="window") from None
        if not 1 <= window_s <= config.state.retention_s:
            raise InvalidRequest(
                f"window must be from 1 s to state.retention_s ({config.state.retention_s:g} s)",
                param="window",
            )
        return window_s

    @router.get("/routes")
    async def get_routes(window: str = "5m") -> dict[str, Any]:
        found = await routes_report(config, store, signals.snapshot(), window_of(window))
        for model, entry in found["models"].items():  # what an applied probe said of each route
            probed = _probe_view(await store.probe(model))
            for probe in (probed or {}).get("ranking", []):
                route = entry["routes"].get(probe["endpoint"])
                if route is not None:
                    route["probe"] = probe | {"at": probed["at"] if probed else None}
        return found

    @router.get("/report")
    async def get_report(window: str = "24h", model: str | None = None) -> dict[str, Any]:
        """The economics report: costs, what-ifs, recommendations, traffic shape, series."""
        if model is not None:
            model_config(model)
        return await economics_report(config, store, signals.snapshot(), window_of(window), model)

    @router.get("/models/{model}")
    async def get_model(model: str) -> dict[str, Any]:
        return await describe(model)

    _probe_routes(router, store, model_config, describe, config.limits)

    @router.put("/models/{model}/canary")
    async def put_canary(model: str, request: Request) -> dict[str, Any]:
        model_config(model)
        body = await admin_body(request, config.limits)
        percent = body.get("percent")
        if isinstance(percent, bool) or not isinstance(percent, int | float) or not 0 <= percent <= 100:
            raise InvalidRequest("'percent' must be a number from 0 to 100", param="percent")
        await store.set_canary(model, float(percent))
        await canary.manual_set(model, float(percent))
        return await describe(model)

    _canary_routes(router, canary, model_config)
    return router


def _canary_routes(
    router: APIRouter, canary: CanaryController, model_config: Callable[[str], ModelConfig]
) -> None:
    @router.get("/models/{model}/canary")
    async def get_canary(model: str, history: int = 20) -> dict[str, Any]:
        """The canary controller's run: state, step, next analysis, plan, history."""
        model_config(model)
        if not 1 <= history <= HISTORY:
            raise InvalidRequest(f"history must be from 1 to {HISTORY}", param="history")
        return await canary.status(model, history)

    @router.get("/models/{model}/canary/plan")
    async def plan_canary(model: str) -> dict[str, Any]:
        """What the controller would do now, on the current window (changes nothing)."""
        model_config(model)
        return await canary.plan_now(model)

    @router.post("/models/{model}/canary/{action}")
    async def act_canary(model: str, action: str) -> dict[str, Any]:
        model_config(model)
        if action not in ACTIONS:
            raise InvalidRequest(
                f"unknown canary action {action!r}; one of {', '.join(ACTIONS)}", param="action"
            )
        await canary.act(model, action)
        return await canary.status(model)


def _probe_routes(
    router: APIRouter,
    store: StateStore,
    model_config: Callable[[str], ModelConfig],
    describe: Callable[[str], Awaitable[dict[str, Any]]],
    limits: LimitsConfig,
) -> None:
    @router.put("/models/{model}/probe")
    async def put_probe(model: str, request: Request) -> dict[str, Any]:
        """A `tidegate probe --apply` ranking: the initial order of `fastest` serverless routes
        until live figures take over; its verdicts are shown here and in the routes report."""
        cfg = model_config(model)
        body = await admin_body(request, limits)
        ranking = body.get("ranking")
        names = {e.name for e in cfg.serverless}
        if (
            not isinstance(ranking, list)
            or len(ranking) > len(cfg.endpoints)
            or not all(isinstance(e, dict) for e in ranking)
        ):
            raise InvalidRequest(
                "'ranking' must be a list of {endpoint, p95_ms, cv_percent, verdict}", param="ranking"
            )
        kept = [e for e in ranking if e.get("endpoint") in names]  # dedicated ones are not ordered
        if len({e["endpoint"] for e in kept}) != len(kept):
            raise InvalidRequest("an endpoint appears twice in 'ranking'", param="ranking")
        unknown = [
            e.get("endpoint") for e in ranking if e.get("endpoint") not in {x.name for x in cfg.endpoints}
        ]
        if unknown:
            raise InvalidRequest(f"not an endpoint of {model}: {unknown[0]!r}", param="ranking")
        stored = {
            "ranking": [_ranked(e) for e in kept],
            "at": str(body.get("at", ""))[:64],
        }
        await store.set_probe(model, orjson.dumps(stored))
        return await describe(model)


async def admin_body(request: Request, limits: LimitsConfig) -> dict[str, Any]:
    """An admin request's JSON object, read only after the admin key was checked (FastAPI
    reads a declared `Body()` before any dependency runs), within the control body limit and
    the body deadline. Any content type is read as JSON, as `curl -d` sends it."""
    body = await read_body(request, limits.max_control_body_bytes, limits.body_timeout_s)
    return json_object(body, "admin request body")


def _ranked(entry: dict[str, Any]) -> dict[str, Any]:
    """One probe ranking entry as stored: known fields only, figures as numbers, text cut short."""
    kept: dict[str, Any] = {"endpoint": entry.get("endpoint")}
    for name in ("p95_ms", "cv_percent"):
        value = entry.get(name)
        kept[name] = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    for name in ("verdict", "caution"):
        value = entry.get(name)
        kept[name] = value[:200] if isinstance(value, str) else None
    return kept


def serverless_order(model: str, cfg: ModelConfig, snapshot: Snapshot) -> list[str]:
    """The serverless order a request of this model gets now (a key that does not explore)."""
    if cfg.routing.serverless is not ServerlessOrder.FASTEST:
        return [e.name for e in cfg.serverless]
    sorter = FastestServerless(cfg.routing.min_samples, explore_percent=0.0)
    return [e.name for e in sorter.sort(RequestContext(model, False, None), snapshot, cfg.serverless)]


def _probe_view(raw: bytes | None) -> dict[str, Any] | None:
    """The applied probe ranking, endpoints over 300% CV flagged."""
    if raw is None:
        return None
    found: dict[str, Any] = orjson.loads(raw)
    for entry in found.get("ranking", []):
        cv = entry.get("cv_percent")
        entry["flagged"] = isinstance(cv, int | float) and cv > 300
    return found


def _circuit(snapshot: Snapshot, route: str) -> dict[str, Any]:
    """`closed`, `open` (with the seconds left) or `half_open` (cooldown over, next is a probe)."""
    until = snapshot.circuit_open.get(route)
    if until is None:
        return {"state": "closed"}
    if snapshot.half_open(route):
        return {"state": "half_open"}
    return {"state": "open", "cooldown_left_s": round(until - snapshot.now, 2)}


_SECRETS: Any = {
    "dedicated": {"__all__": {"api_key"}},
    "serverless": {"__all__": {"api_key"}},
}
