"""Calibrations fitted to what is known of a deployment: a gateway config's prices, a running
gateway's route figures, a `tidegate probe` result. `tidegate plan` (tidegate/cli/plan.py)
reads them and applies its flags on top; the fitting itself is here, apart from the CLI."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from router.config import DedicatedEndpoint, ServerlessEndpoint
from tidegate.offline.calibration import DedicatedCalibration, ServerlessCalibration, TtftDistribution

Z95 = 1.6449  # the standard normal's 95th percentile: a log-normal's p95 / p50 = exp(Z95 x sigma)


def ttft_from_quantiles(p50_ms: float, p95_ms: float, cold_range_s: tuple[float, float]) -> TtftDistribution:
    """A log-normal TTFT with the measured median and p95 (a probe's or a route's figures)."""
    if p50_ms <= 0 or p95_ms < p50_ms:
        raise ValueError(f"TTFT p50 {p50_ms} ms and p95 {p95_ms} ms cannot describe a distribution")
    return TtftDistribution(p50_ms / 1000, math.log(p95_ms / p50_ms) / Z95, cold_range_s=cold_range_s)


def with_config_prices(d: DedicatedCalibration, endpoint: DedicatedEndpoint | None) -> DedicatedCalibration:
    """The dedicated figures at a config's GPU count and price (when it names a price)."""
    if endpoint is None or endpoint.gpu_hour_usd <= 0:
        return d
    return dataclasses.replace(d, gpus=endpoint.gpus, gpu_hour_usd=endpoint.gpu_hour_usd)


def with_token_prices(s: ServerlessCalibration, endpoint: ServerlessEndpoint | None) -> ServerlessCalibration:
    """The serverless figures at a config's token prices (when it names any)."""
    if endpoint is None or not (endpoint.usd_per_mtok_in or endpoint.usd_per_mtok_out):
        return s
    return dataclasses.replace(
        s, usd_per_mtok_in=endpoint.usd_per_mtok_in, usd_per_mtok_out=endpoint.usd_per_mtok_out
    )


def probe_ttft(found: Mapping[str, Any], endpoint: str | None, cold: tuple[float, float]) -> TtftDistribution:
    """The serverless TTFT from `tidegate probe --out`'s probe.json (one endpoint's figures)."""
    rows = [r for r in found.get("endpoints", []) if endpoint is None or r.get("endpoint") == endpoint]
    rows = [r for r in rows if isinstance(r.get("ttft_ms"), dict)]
    if len(rows) != 1:
        names = ", ".join(str(r.get("endpoint")) for r in found.get("endpoints", []))
        raise ValueError(f"name one endpoint with --probe-endpoint (measured: {names or 'none'})")
    ttft = rows[0]["ttft_ms"]
    return ttft_from_quantiles(float(ttft["median"]), float(ttft["p95"]), cold)


def fit_to_routes(
    routes: Mapping[str, Any], d: DedicatedCalibration, s: ServerlessCalibration
) -> tuple[DedicatedCalibration, ServerlessCalibration, list[str]]:
    """Fit the model to a gateway's route figures (GET /admin/routes, one model's `routes`): the
    dedicated route's prefill rate from its median TTFT and mean prompt (the fixed overhead
    kept), its decode step from its median ITL, and the serverless route's TTFT from its p50
    and p95. The figures are medians over the window: fit on a window of light load, where the
    TTFT is prefill and not a queue. The notes say what was fitted (none: nothing could be)."""
    notes: list[str] = []
    for name, route in routes.items():
        ttft = route.get("ttft_ms") or {}
        requests = route.get("requests") or 0
        if not ttft or not requests:
            continue
        if route.get("kind") == "dedicated":
            prompt = route.get("tokens_in", 0) / requests
            prefill_s = ttft["p50"] / 1000 - d.overhead_s
            if prompt > 0 and prefill_s > 0:
                d = dataclasses.replace(d, prefill_tokens_per_s=prompt / prefill_s)
                notes.append(
                    f"{name}: prefill {d.prefill_tokens_per_s:,.0f} tokens/s ({prompt:.0f}-token prompts)"
                )
            if route.get("itl_p50_ms"):
                d = dataclasses.replace(d, itl_s=route["itl_p50_ms"] / 1000)
                notes.append(f"{name}: decode step {route['itl_p50_ms']:.1f} ms")
        elif ttft.get("p95", 0) >= ttft.get("p50", 0) > 0:
            s = dataclasses.replace(
                s, ttft=ttft_from_quantiles(ttft["p50"], ttft["p95"], s.ttft.cold_range_s)
            )
            notes.append(f"{name}: TTFT p50 {ttft['p50']:.0f} ms, p95 {ttft['p95']:.0f} ms")
    return d, s, notes
