"""What the admin API shows of a model (its config, live state and routes) and how it reads a
`tidegate probe --apply` ranking and `tidegate parity --apply` verdicts: pure functions of the
config and a snapshot."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from policies.base import RequestContext
from policies.serverless import FastestServerless, ServerlessOrder
from policies.types import Snapshot, route_key
from router.config import ModelConfig
from router.economics.routes_report import figures_json
from router.errors import InvalidRequest

_SECRETS: Any = {
    "dedicated": {"__all__": {"api_key"}},
    "serverless": {"__all__": {"api_key"}},
}


def canary_fields(cfg: ModelConfig, live: float | None) -> dict[str, Any]:
    """A model's canary percent as the admin API shows it; `live`: the store's (None: the file's)."""
    return {
        "canary_percent": cfg.canary_percent if live is None else live,
        "configured_canary_percent": cfg.canary_percent,
        # live: set by `canary set` or a canary run, kept in the store across restarts, and
        # obeyed over the file's until `canary reset` (DELETE /admin/models/{m}/canary)
        "canary_percent_source": "file" if live is None else "live",
    }


def model_view(
    model: str,
    cfg: ModelConfig,
    snapshot: Snapshot,
    ranking: bytes | None,
    parity: bytes | None = None,
    *,
    live: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A model as `GET /admin/models/{model}` shows it (never an upstream's key). `live`: each
    serving endpoint's URL now (a DNS pool's slot set with no replica on it is absent)."""
    urls = live if live is not None else {e.name: e.base_url for e in cfg.endpoints}
    return {
        "model": model,
        **canary_fields(cfg, snapshot.canary_percent.get(model)),
        "config": cfg.model_dump(mode="json", exclude=_SECRETS),
        "dedicated": [
            _pool_view(model, d.name, d.max_concurrency, snapshot) | {"base_url": urls.get(d.name)}
            for d in cfg.dedicated
        ],
        "routes": {
            e.name: {
                "kind": e.kind.value,
                "circuit": circuit_view(snapshot, route_key(model, e.name)),
                "ttft_ms": figures_json(snapshot.ttft.get(route_key(model, e.name))),
                "e2e_ms": figures_json(snapshot.e2e.get(route_key(model, e.name))),
            }
            for e in cfg.endpoints
        },
        "serverless_order": serverless_order(model, cfg, snapshot),
        "probe": probe_view(ranking),
        "parity": parity_view(parity, cfg),
    }


def _pool_view(model: str, pool: str, capacity: int, snapshot: Snapshot) -> dict[str, Any]:
    return {
        "name": pool,
        "max_concurrency": capacity,
        "in_flight": snapshot.in_flight.get(pool, 0),
        "waiting": snapshot.waiting.get(pool, 0),
        "queue_depth": snapshot.queue_depth(pool),
        "slo_breached": route_key(model, pool) in snapshot.slo_breached,
        "engine_saturated": pool in snapshot.engine_saturated,
    }


def serverless_order(model: str, cfg: ModelConfig, snapshot: Snapshot) -> list[str]:
    """The serverless order a request of this model gets now (a key that does not explore)."""
    if cfg.routing.serverless is not ServerlessOrder.FASTEST:
        return [e.name for e in cfg.serverless]
    sorter = FastestServerless(cfg.routing.min_samples, explore_percent=0.0)
    return [e.name for e in sorter.sort(RequestContext(model, False, None), snapshot, cfg.serverless)]


def circuit_view(snapshot: Snapshot, route: str) -> dict[str, Any]:
    """`closed`, `open` (with the seconds left) or `half_open` (cooldown over: the next request
    is its trial)."""
    until = snapshot.circuit_open.get(route)
    if until is None:
        return {"state": "closed"}
    if snapshot.half_open(route):
        return {"state": "half_open"}
    return {"state": "open", "cooldown_left_s": round(until - snapshot.now, 2)}


def probe_view(raw: bytes | None) -> dict[str, Any] | None:
    """The applied probe ranking, endpoints over 300% CV flagged."""
    if raw is None:
        return None
    found: dict[str, Any] = orjson.loads(raw)
    for entry in found.get("ranking", []):
        cv = entry.get("cv_percent")
        entry["flagged"] = isinstance(cv, int | float) and cv > 300
    return found


def ranking_to_store(model: str, cfg: ModelConfig, body: dict[str, Any]) -> bytes:
    """A `PUT .../probe` body as the stores keep it: the serverless endpoints' entries (the
    dedicated ones are not ordered), known fields only. InvalidRequest names what is wrong."""
    ranking = body.get("ranking")
    if (
        not isinstance(ranking, list)
        or len(ranking) > len(cfg.endpoints)
        or not all(isinstance(e, dict) and isinstance(e.get("endpoint"), str) for e in ranking)
    ):
        raise InvalidRequest(
            "'ranking' must be a list of {endpoint, p95_ms, cv_percent, verdict}", param="ranking"
        )
    names = {e.name for e in cfg.serverless}
    kept = [e for e in ranking if e.get("endpoint") in names]
    if len({e["endpoint"] for e in kept}) != len(kept):
        raise InvalidRequest("an endpoint appears twice in 'ranking'", param="ranking")
    unknown = [e.get("endpoint") for e in ranking if e.get("endpoint") not in {x.name for x in cfg.endpoints}]
    if unknown:
        raise InvalidRequest(f"not an endpoint of {model}: {unknown[0]!r}", param="ranking")
    return orjson.dumps({"ranking": [_ranked(e) for e in kept], "at": str(body.get("at", ""))[:64]})


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


VERDICTS = ("parity", "diverges", "inconclusive", "reference")


def parity_to_store(model: str, cfg: ModelConfig, body: dict[str, Any]) -> bytes:
    """A `PUT .../parity` body (`tidegate parity --apply`) as the stores keep it: per endpoint
    of the model its verdict, why, pass rate, agreement and failed cases; known fields only,
    text cut short. InvalidRequest names what is wrong."""
    endpoints = body.get("endpoints")
    names = {e.name for e in cfg.endpoints}
    if (
        not isinstance(endpoints, dict)
        or not endpoints
        or not all(isinstance(v, dict) for v in endpoints.values())
    ):
        raise InvalidRequest("'endpoints' must map endpoint names to {verdict, ...}", param="endpoints")
    unknown = sorted(set(endpoints) - names)
    if unknown:
        raise InvalidRequest(f"not an endpoint of {model}: {unknown[0]!r}", param="endpoints")
    kept = {}
    for name, entry in endpoints.items():
        if entry.get("verdict") not in VERDICTS:
            raise InvalidRequest(
                f"endpoints.{name}.verdict must be one of {', '.join(VERDICTS)}", param="endpoints"
            )
        cases = entry.get("failed_cases")
        kept[name] = {
            "verdict": entry["verdict"],
            "why": str(entry.get("why", ""))[:300],
            "pass_rate": _number(entry.get("pass_rate")),
            "agreement": _number(entry.get("agreement")),
            "failed_cases": [str(c)[:100] for c in cases[:50]] if isinstance(cases, list) else [],
        }
    reference = str(body.get("reference", ""))[:100]
    return orjson.dumps({"endpoints": kept, "reference": reference, "at": str(body.get("at", ""))[:64]})


def parity_view(raw: bytes | None, cfg: ModelConfig) -> dict[str, Any] | None:
    """The applied parity verdicts, each endpoint marked whether it is out of the spill order
    now (`excluded`: enforce is on, it diverges, and it is a serverless endpoint)."""
    if raw is None:
        return None
    found: dict[str, Any] = orjson.loads(raw)
    serverless = {e.name for e in cfg.serverless}
    for name, entry in found.get("endpoints", {}).items():
        out = cfg.parity.enforce and entry.get("verdict") == "diverges" and name in serverless
        entry["excluded"] = out
        entry["reason"] = "parity_diverges" if out else None
    return found | {"enforce": cfg.parity.enforce}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
