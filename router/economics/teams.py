"""Spend and successes per team of named keys (docs/tenants.md): the serverless spend the
team's requests were priced at, plus its share of each dedicated pool's provisioned cost by
the slot time its requests held (the pool's idle time is nobody's and stays in the blended
figure). Successes are successful requests; the cost per success divides the two."""

from __future__ import annotations

from typing import Any

from policies.types import route_key
from router.config import DedicatedEndpoint, ModelConfig
from router.economics.cost import per_success
from router.economics.costs import Span, provisioned
from router.state.latency import Counts

TEAM = "team:"


def team_fields(team: str, *, ok: bool, usd: float, busy_ms: float) -> dict[str, float]:
    """The counters one request of a named key adds on its route for the key's team
    (`team:<team>:n|ok|usd|busy_ms`): the economics report's cost per success by team."""
    fields = {f"{TEAM}{team}:n": 1.0}
    if ok:
        fields[f"{TEAM}{team}:ok"] = 1.0
    if usd:
        fields[f"{TEAM}{team}:usd"] = usd
    if busy_ms:
        fields[f"{TEAM}{team}:busy_ms"] = busy_ms
    return fields


def teams_of(counts: Counts) -> dict[str, dict[str, float]]:
    """Per team, its fields in one route's counters."""
    found: dict[str, dict[str, float]] = {}
    for name, value in counts.items():
        if name.startswith(TEAM):
            team, _, field = name[len(TEAM) :].rpartition(":")
            found.setdefault(team, {})[field] = value
    return found


def team_costs(name: str, model: ModelConfig, counts: dict[str, Counts], span: Span) -> dict[str, Any]:
    teams: dict[str, dict[str, float]] = {}
    for endpoint in model.endpoints:
        c = counts.get(route_key(name, endpoint.name), {})
        busy_ms = c.get("busy_ms", 0.0)
        paid = 0.0
        if isinstance(endpoint, DedicatedEndpoint):
            paid = provisioned(endpoint, span.start, span.end).cost_usd
        for team, fields in teams_of(c).items():
            t = teams.setdefault(team, {"requests": 0.0, "ok": 0.0, "usd": 0.0, "dedicated_usd": 0.0})
            t["requests"] += fields.get("n", 0.0)
            t["ok"] += fields.get("ok", 0.0)
            t["usd"] += fields.get("usd", 0.0)
            if paid and busy_ms > 0:
                t["dedicated_usd"] += paid * fields.get("busy_ms", 0.0) / busy_ms
    return {
        team: {
            "requests": int(t["requests"]),
            "successes": int(t["ok"]),
            "serverless_usd": round(t["usd"], 6),
            "dedicated_share_usd": round(t["dedicated_usd"], 6),
            "cost_usd": round(t["usd"] + t["dedicated_usd"], 6),
            "cost_per_success_usd": per_success(t["usd"] + t["dedicated_usd"], int(t["ok"])),
        }
        for team, t in sorted(teams.items())
    }
