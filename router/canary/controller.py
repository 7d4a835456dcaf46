"""The canary controller: moves a model's canary percent step by step toward dedicated, judged
every `interval_s` on dedicated-vs-serverless figures (router/canary/analysis.py), with
automatic rollback. The percent it sets is the one the gateway already obeys (the canary gate
is sticky, so a raise only adds keys).

A run is a state machine per model, persisted in the state store with a version:
`idle -> progressing -> promoted`, or `paused`, or `rolled_back`. Exactly one replica acts: the
holder of a leader lease in the store, renewed every tick; every write of the leader is fenced
by that lease and by the version it read, so a paused old leader cannot write after losing the
lease and an admin's action is never overwritten by an analysis that read the run before it.
Killing the leader hands over within `state.leader_ttl_s`, and the next leader continues from
the persisted run. Admin actions (start, pause, resume, abort, promote, a manual `canary set`)
work from any replica; a manual set pauses a run in progress: the human wins.

Every analysis is an event in the run's history (kept to `HISTORY` events) and one JSON line
on the `tidegate.canary` logger.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, replace
from typing import Any, Protocol

import orjson
from prometheus_client import CollectorRegistry, Counter

from policies.types import Snapshot, route_key
from router.canary.analysis import Analysis, Side, Verdict, analyse, with_parity
from router.canary.gauges import ModelGauges
from router.canary.run import (
    ACTIONS,
    DECISIONS,
    IDLE,
    PAUSED,
    PROGRESSING,
    CanaryConflict,
    CanaryRun,
    admin_action,
    decide,
    started,
)
from router.canary.weights import Rates, like_with_like
from router.config import CanaryControllerConfig, GatewayConfig, ModelConfig
from router.economics.costs import provisioned
from router.errors import StoreUnavailable
from router.periodic import Loops, stop
from router.record.callers import callers_of
from router.state.latency import Counts, Histogram, Metric, add_counts
from router.state.rankings import verdicts_of
from router.state.roles import CanaryRuns, Leadership, Rankings, Windows

log = logging.getLogger("tidegate")
events_log = logging.getLogger("tidegate.canary")

HISTORY = 200  # events kept per model
TICK_S = 1.0  # how often the controller renews its lease and looks at the runs
_CAS_TRIES = 8


class CanaryStore(Protocol):
    """The store's roles the controller uses (router/state/roles.py)."""

    @property
    def leadership(self) -> Leadership: ...

    @property
    def canary(self) -> CanaryRuns: ...

    @property
    def series(self) -> Windows: ...

    @property
    def rankings(self) -> Rankings: ...


class CanaryController:
    def __init__(
        self,
        config: GatewayConfig,
        store: CanaryStore,
        snapshot: Callable[[], Snapshot],
        registry: CollectorRegistry | None = None,
        *,
        tick_s: float = TICK_S,
        loops: Loops | None = None,
    ) -> None:
        self._config = config
        self._loops = loops or Loops()
        self._store = store
        self._snapshot = snapshot
        self._tick_s = tick_s
        self._ttl_s = config.state.leader_ttl_s
        self.token = f"{socket.gethostname()}:{os.getpid()}:{random.getrandbits(32):08x}"
        self.leading = False
        self._models = {name: m for name, m in config.models.items() if m.canary is not None}
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._analyses = Counter(
            "tidegate_canary_analysis",
            "Canary analyses by the controller, by verdict",
            ("model", "result"),
            registry=registry,
        )
        self._actions = Counter(
            "tidegate_canary_actions",
            "Canary run changes written by this process (step_up, promote, rollback, pause, ...)",
            ("model", "action"),
            registry=registry,
        )
        for name in self._models:  # every series exists from the start (at 0), for rate() and alerts
            for result in (v.value for v in Verdict):
                self._analyses.labels(name, result)
            for action in (*DECISIONS, *ACTIONS, "manual_set"):
                self._actions.labels(name, action)
        if registry is not None:
            registry.register(ModelGauges(config, snapshot))

    # --- the leader's loop ----------------------------------------------------------------

    def start(self) -> None:
        if self._models and self._task is None:
            loop = self._loops.every(
                "canary controller", self._tick_s, self._turn, self._stop, survives=(StoreUnavailable,)
            )
            self._task = asyncio.get_running_loop().create_task(loop)

    async def close(self) -> None:
        await stop(self._task, self._stop)
        self._task = None
        if self.leading:
            with contextlib.suppress(StoreUnavailable, OSError):
                await self._store.leadership.resign(self.token)
            self.leading = False

    async def _turn(self) -> None:
        """One tick; with the store unreachable this process does not act, nor lead."""
        try:
            await self.tick()
        except StoreUnavailable:
            self.leading = False
            raise

    async def tick(self) -> None:
        was_leading = self.leading
        self.leading = await self._store.leadership.lead(self.token, self._ttl_s)
        if self.leading != was_leading:
            log.info("canary controller %s: %s", self.token, "leading" if self.leading else "not leading")
        if not self.leading:
            return
        for model, config in self._models.items():
            await self._advance(model, config)
            if not self.leading:
                return

    async def _advance(self, model: str, config: ModelConfig) -> None:
        canary = config.canary
        assert canary is not None
        version, raw = await self._store.canary.canary_run(model)
        run = CanaryRun.parse(raw)
        now = time.time()
        if run.state == IDLE and run.started_at is None and canary.start == "auto":
            await self._write(model, version, started(canary, now), "start", None, leader=True, before=run)
            return
        if run.state != PROGRESSING:
            return
        if self._snapshot().canary_percent.get(model) != run.percent:  # a lost write, re-asserted
            await self._store.canary.set_canary(model, run.percent)
        if run.next_at is not None and now < run.next_at:
            return
        analysis = await self.analyse(model, config)
        self._analyses.labels(model, analysis.verdict.value).inc()
        after, action = decide(run, analysis, canary, now)
        await self._write(model, version, after, action, analysis, leader=True, before=run)

    async def _write(
        self,
        model: str,
        version: int,
        run: CanaryRun,
        action: str,
        analysis: Analysis | None,
        *,
        leader: bool,
        before: CanaryRun | None = None,
    ) -> int:
        """Persist `run` (fenced, versioned) with its event; then set the live percent."""
        previous = None
        if before is not None:  # a run that never started had the configured (or set) percent
            previous = before.percent if before.started_at is not None else await self._live_percent(model)
        event = {
            "at": time.time(),
            "model": model,
            "action": action,
            "state": run.state,
            "percent": run.percent,
            "percent_before": previous,
            "by": self.token if leader else "admin",
            "verdict": analysis.verdict.value if analysis else None,
            "reason": analysis.reason if analysis else run.note,
            "analysis": analysis.as_json() if analysis else None,
        }
        written = await self._store.canary.write_canary(
            model,
            run.as_json(),
            orjson.dumps(event),
            version=version,
            leader=self.token if leader else None,
            history=HISTORY,
        )
        if written == 0:
            self.leading = False  # fenced out: another replica leads now
            return written
        if written > 0:
            await self._store.canary.set_canary(model, run.percent)
            self._actions.labels(model, action).inc()
            events_log.info(orjson.dumps({k: v for k, v in event.items() if k != "analysis"}).decode())
        return written

    # --- figures ----------------------------------------------------------------------------

    async def analyse(self, model: str, config: ModelConfig) -> Analysis:
        """Dedicated against serverless over the last interval (merged across replicas)."""
        canary = config.canary
        assert canary is not None
        window = canary.interval_s
        dedicated = [route_key(model, e.name) for e in config.dedicated]
        serverless = [route_key(model, e.name) for e in config.serverless]
        routes = dedicated + serverless
        counts = await self._store.series.counts_window(routes, window)
        ttft = await self._store.series.latency_window(routes, Metric.TTFT, window)
        itl = await self._store.series.latency_window(routes, Metric.ITL, window)
        per_token = await self._store.series.latency_window(routes, Metric.E2E_PER_TOKEN, window)
        now = time.time()
        ded_cost = sum(provisioned(e, now - window, now).cost_usd for e in config.dedicated)
        ded_rates, sl_rates = like_with_like(
            callers_of(counts.get(r, {}) for r in dedicated),
            callers_of(counts.get(r, {}) for r in serverless),
            canary.max_caller_share,
            canary.min_callers,
        )
        found = analyse(
            _side(dedicated, counts, (ttft, itl, per_token), cost=ded_cost, weighted=ded_rates),
            _side(serverless, counts, (ttft, itl, per_token), cost=None, weighted=sl_rates),
            canary.checks,
            canary.min_samples,
            canary.min_callers,
        )
        judged = verdicts_of(await self._store.rankings.parity(model))
        names = [e.name for e in config.dedicated if e.name in judged]
        diverging = [name for name in names if judged[name] == "diverges"]
        return with_parity(found, diverging, bool(names), config.parity.enforce)

    # --- admin (any replica) ------------------------------------------------------------

    def controlled(self, model: str) -> CanaryControllerConfig:
        config = self._config.models[model].canary
        if config is None:
            raise CanaryConflict(f"model {model} has no canary controller configured (models.{model}.canary)")
        return config

    async def act(self, model: str, action: str) -> CanaryRun:
        """start, pause, resume, abort or promote, whatever the leader is doing."""
        canary = self.controlled(model)
        for _ in range(_CAS_TRIES):
            version, raw = await self._store.canary.canary_run(model)
            before = CanaryRun.parse(raw)
            after = admin_action(before, action, canary, time.time())
            written = await self._write(model, version, after, action, None, leader=False, before=before)
            if written > 0:
                return after
        raise CanaryConflict(f"the canary run of {model} kept changing; try again")

    async def manual_set(self, model: str, percent: float, note: str = "") -> None:
        """A person set the percent: a run in progress pauses (the human wins), recorded."""
        if model not in self._models:
            return
        for _ in range(_CAS_TRIES):
            version, raw = await self._store.canary.canary_run(model)
            before = CanaryRun.parse(raw)
            if before.state != PROGRESSING:
                return
            note = f"paused: canary {note or f'set to {percent:g}%'} by hand"
            after = replace(before, state=PAUSED, percent=percent, note=note, updated_at=time.time())
            if await self._write(model, version, after, "manual_set", None, leader=False, before=before) > 0:
                return

    async def _live_percent(self, model: str) -> float:
        """The percent obeyed now, as the store holds it (the snapshot may lag a write by up to a
        refresh): the live override, else the config file's."""
        live = await self._store.canary.live_canary(model)
        return self._config.models[model].canary_percent if live is None else live

    async def status(self, model: str, history: int = 20) -> dict[str, Any]:
        canary = self.controlled(model)
        version, raw = await self._store.canary.canary_run(model)
        run = CanaryRun.parse(raw)
        events = [orjson.loads(e) for e in await self._store.canary.canary_history(model, history)]
        live = await self._store.canary.live_canary(model)
        configured = self._config.models[model].canary_percent
        return {
            "model": model,
            "run": asdict(run),
            "version": version,
            "live_percent": configured if live is None else live,
            "configured_percent": configured,
            "live_override": live is not None,  # obeyed over the file's
            "plan": list(canary.plan()),
            "interval_s": canary.interval_s,
            "next_analysis_in_s": max(0.0, run.next_at - time.time())
            if run.next_at and run.state == PROGRESSING
            else None,
            "history": events,
            "this_replica": {"token": self.token, "leading": self.leading},
        }

    async def plan_now(self, model: str) -> dict[str, Any]:
        """What the controller would do now on the current window, without doing it."""
        canary = self.controlled(model)
        run = CanaryRun.parse((await self._store.canary.canary_run(model))[1])
        analysis = await self.analyse(model, self._config.models[model])
        trial = run if run.state == PROGRESSING else started(canary, time.time())
        after, action = decide(trial, analysis, canary, time.time())
        return {
            "model": model,
            "state": run.state,
            "percent": trial.percent,
            "would": action,
            "percent_after": after.percent,
            # no run in progress (idle, promoted, ...): what a run started now would do first
            "hypothetical": run.state != PROGRESSING,
            "analysis": analysis.as_json(),
        }


def _side(
    routes: Iterable[str],
    counts: dict[str, Counts],
    latencies: tuple[dict[str, Histogram], dict[str, Histogram], dict[str, Histogram]],
    *,
    cost: float | None,
    weighted: Rates,
) -> Side:
    """One side's figures: the requests its routes answer for, by caller (failed attempts that
    failed over among its errors), its caller-weighted rates, and its TTFT, ITL and e2e per
    output token (`latencies`, by route)."""
    total: Counts = {}
    merged = (Histogram(), Histogram(), Histogram())
    for route in routes:
        add_counts(total, counts.get(route, {}))
        for into, by_route in zip(merged, latencies, strict=True):
            into.merge(by_route.get(route, Histogram()))
    answered = callers_of([total]).values()
    ttft, itl, per_token = (h.figures() for h in merged)
    return Side(
        requests=int(sum(c.requests for c in answered)),
        errors=int(sum(c.errors for c in answered)),
        successes=int(sum(c.successes for c in answered)),
        weighted=weighted,
        ttft_p95_ms=ttft.p95 if ttft else None,
        itl_p50_ms=itl.p50 if itl else None,
        e2e_per_token_p95_ms=per_token.p95 if per_token else None,
        cost_usd=total.get("cost_usd", 0.0) if cost is None else cost,
        successful_tasks=total.get("tasks_ok", 0.0),
    )


def live_overrides(config: GatewayConfig, live: Mapping[str, float]) -> list[str]:
    """One line per model whose live canary percent (a `canary set`, or a run's, kept in the
    store across restarts) differs from its file's `canary_percent`: said when `serve` starts,
    since the file alone would mislead whoever reads it."""
    return [
        f"model {name}: the live canary percent {live[name]:g}% overrides canary_percent "
        f"{model.canary_percent:g} in the config file (set live, kept in the state store); "
        f"`tidegate canary reset {name}` returns to the file's"
        for name, model in config.models.items()
        if name in live and live[name] != model.canary_percent
    ]
