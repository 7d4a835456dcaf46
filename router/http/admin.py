"""The admin API: a model's configuration and live state, the routes and economics reports,
its canary percent and run, and the applied probe ranking and parity verdicts.

Every route needs `Authorization: Bearer <auth.admin_key>`; with no admin key configured
the admin API answers 403. A body is read only after the key was checked, within
`limits.max_control_body_bytes`. Upstream API keys never appear in its output.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from router.canary.controller import HISTORY, CanaryController
from router.canary.run import ACTIONS
from router.config import GatewayConfig, ModelConfig
from router.economics.report import economics_report
from router.economics.routes_report import parse_window, routes_report
from router.errors import ClientError, InvalidRequest, ModelNotFound, Unauthorized
from router.fleet.membership import Fleet
from router.http.admin_views import (
    canary_fields,
    model_view,
    parity_to_store,
    parity_view,
    probe_view,
    ranking_to_store,
)
from router.http.auth import ApiKeys, KeyDigests, bearer_token
from router.http.bodies import read_body
from router.http.keys_admin import keys_routes
from router.openai import json_object
from router.signals.loop import Signals
from router.state.roles import StateStore


class AdminDisabled(ClientError):
    status = 403
    code = "admin_disabled"


class Admin:
    """What every admin route needs: the key check, the model's config, its view, a window."""

    def __init__(
        self,
        config: GatewayConfig,
        store: StateStore,
        signals: Signals,
        canary: CanaryController,
        fleet: Fleet | None = None,
    ) -> None:
        self.config, self.store, self.signals, self.canary = config, store, signals, canary
        self.fleet = fleet
        self._key = KeyDigests([config.auth.admin_key])

    def require(self, request: Request) -> None:
        if not self._key:
            raise AdminDisabled("The admin API is disabled: set auth.admin_key to enable it.")
        token = bearer_token(request)
        if token is None or not self._key.accepts(token):
            raise Unauthorized("A valid admin key is required: 'Authorization: Bearer ADMIN_KEY'.")

    def model(self, model: str) -> ModelConfig:
        found = self.config.models.get(model)
        if found is None:
            raise ModelNotFound(f"The model `{model}` is not configured", param="model")
        return found

    async def describe(self, model: str) -> dict[str, Any]:
        cfg, snapshot = self.model(model), self.signals.snapshot()
        view = model_view(
            model,
            cfg,
            snapshot,
            await self.store.rankings.probe(model),
            await self.store.rankings.parity(model),
            live={e.name: e.base_url for e in self.fleet.endpoints(model)} if self.fleet else None,
        )
        return view | {"window_s": self.config.state.window_s, "state_store": self.store.name}

    def window(self, window: str) -> float:
        try:
            window_s = parse_window(window)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="window") from None
        retention_s = self.config.state.retention_s
        if not 1 <= window_s <= retention_s:
            raise InvalidRequest(
                f"window must be from 1 s to state.retention_s ({retention_s:g} s)", param="window"
            )
        return window_s

    async def body(self, request: Request) -> dict[str, Any]:
        """The request's JSON object, whatever its content type (`curl -d` sends a form type)."""
        limits = self.config.limits
        body = await read_body(request, limits.max_control_body_bytes, limits.body_timeout_s)
        return json_object(body, "admin request body")


def admin_router(
    config: GatewayConfig,
    store: StateStore,
    signals: Signals,
    canary: CanaryController,
    keys: ApiKeys,
    *,
    fleet: Fleet | None = None,
) -> APIRouter:
    admin = Admin(config, store, signals, canary, fleet)
    router = APIRouter(prefix="/admin", dependencies=[Depends(admin.require)])
    keys_routes(router, config, store.quotas, keys, admin.body)
    _report_routes(router, admin)
    _model_routes(router, admin)
    _canary_routes(router, admin)
    return router


def _report_routes(router: APIRouter, admin: Admin) -> None:
    @router.get("/routes")
    async def get_routes(window: str = "5m") -> dict[str, Any]:
        snapshot, window_s = admin.signals.snapshot(), admin.window(window)
        found = await routes_report(admin.config, admin.store, snapshot, window_s)
        for model, entry in found["models"].items():  # what an applied probe said of each route
            probed = probe_view(await admin.store.rankings.probe(model))
            for probe in (probed or {}).get("ranking", []):
                route = entry["routes"].get(probe["endpoint"])
                if route is not None:
                    route["probe"] = probe | {"at": probed["at"] if probed else None}
            verdicts = parity_view(await admin.store.rankings.parity(model), admin.model(model))
            for name, verdict in (verdicts or {}).get("endpoints", {}).items():
                route = entry["routes"].get(name)
                if route is not None:
                    route["parity"] = verdict | {"at": verdicts["at"] if verdicts else None}
        return found

    @router.get("/report")
    async def get_report(window: str = "24h", model: str | None = None) -> dict[str, Any]:
        """The economics report: costs, what-ifs, recommendations, traffic shape, series."""
        if model is not None:
            admin.model(model)
        snapshot = admin.signals.snapshot()
        return await economics_report(admin.config, admin.store, snapshot, admin.window(window), model)


def _model_routes(router: APIRouter, admin: Admin) -> None:
    @router.get("/models/{model}")
    async def get_model(model: str) -> dict[str, Any]:
        return await admin.describe(model)

    @router.put("/models/{model}/canary")
    async def put_canary(model: str, request: Request) -> dict[str, Any]:
        config = admin.model(model)
        percent = (await admin.body(request)).get("percent")
        if isinstance(percent, bool) or not isinstance(percent, int | float) or not 0 <= percent <= 100:
            raise InvalidRequest("'percent' must be a number from 0 to 100", param="percent")
        await admin.store.canary.set_canary(model, float(percent))
        await admin.canary.manual_set(model, float(percent))
        # the store holds it now; the snapshot the view reads catches up at its next refresh
        return await admin.describe(model) | canary_fields(config, float(percent))

    @router.delete("/models/{model}/canary")
    async def reset_canary(model: str) -> dict[str, Any]:
        """Back to the config file's canary_percent: the live percent (a `canary set`, or a
        run's) is dropped on every replica, and a run in progress pauses (the human wins)."""
        config = admin.model(model)
        await admin.store.canary.clear_canary(model)
        await admin.canary.manual_set(
            model, config.canary_percent, note=f"reset to the file's {config.canary_percent:g}%"
        )
        return await admin.describe(model) | canary_fields(config, None)

    @router.put("/models/{model}/probe")
    async def put_probe(model: str, request: Request) -> dict[str, Any]:
        """A `tidegate probe --apply` ranking: the initial order of `fastest` serverless routes
        until live figures take over; its verdicts are shown here and in the routes report."""
        ranking = ranking_to_store(model, admin.model(model), await admin.body(request))
        await admin.store.rankings.set_probe(model, ranking)
        return await admin.describe(model)

    @router.put("/models/{model}/parity")
    async def put_parity(model: str, request: Request) -> dict[str, Any]:
        """A `tidegate parity --apply` run's verdicts: with `parity.enforce` a diverging
        serverless endpoint leaves the spill order and the canary holds while a dedicated one
        diverges; shown here and in the routes report either way."""
        verdicts = parity_to_store(model, admin.model(model), await admin.body(request))
        await admin.store.rankings.set_parity(model, verdicts)
        return await admin.describe(model)


def _canary_routes(router: APIRouter, admin: Admin) -> None:
    @router.get("/models/{model}/canary")
    async def get_canary(model: str, history: int = 20) -> dict[str, Any]:
        """The canary controller's run: state, step, next analysis, plan, history."""
        admin.model(model)
        if not 1 <= history <= HISTORY:
            raise InvalidRequest(f"history must be from 1 to {HISTORY}", param="history")
        return await admin.canary.status(model, history)

    @router.get("/models/{model}/canary/plan")
    async def plan_canary(model: str) -> dict[str, Any]:
        """What the controller would do now, on the current window (changes nothing)."""
        admin.model(model)
        return await admin.canary.plan_now(model)

    @router.post("/models/{model}/canary/{action}")
    async def act_canary(model: str, action: str) -> dict[str, Any]:
        admin.model(model)
        if action not in ACTIONS:
            raise InvalidRequest(
                f"unknown canary action {action!r}; one of {', '.join(ACTIONS)}", param="action"
            )
        await admin.canary.act(model, action)
        return await admin.canary.status(model)
