"""The figures `tidegate plan` models with: a named calibration, overridden by a gateway
config's prices and by each engine or price flag, and a serverless TTFT from a preset or a
`tidegate probe` result."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import orjson

from router.config import DedicatedEndpoint, ServerlessEndpoint
from router.offline import calibration
from router.offline.calibration import (
    SERVERLESS_PRESETS,
    DedicatedCalibration,
    ServerlessCalibration,
    TtftDistribution,
)

Z95 = 1.6449  # the standard normal's 95th percentile: a log-normal's p95 / p50 = exp(Z95 x sigma)


def ttft_from_quantiles(p50_ms: float, p95_ms: float, cold_range_s: tuple[float, float]) -> TtftDistribution:
    """A log-normal TTFT with the measured median and p95 (a probe's or a route's figures)."""
    if p50_ms <= 0 or p95_ms < p50_ms:
        raise ValueError(f"TTFT p50 {p50_ms} ms and p95 {p95_ms} ms cannot describe a distribution")
    return TtftDistribution(p50_ms / 1000, math.log(p95_ms / p50_ms) / Z95, cold_range_s=cold_range_s)


def dedicated_figures(
    args: argparse.Namespace, config_endpoint: DedicatedEndpoint | None
) -> DedicatedCalibration:
    d = calibration.DEDICATED[args.calibration]
    if config_endpoint is not None and config_endpoint.gpu_hour_usd > 0:
        d = dataclasses.replace(d, gpus=config_endpoint.gpus, gpu_hour_usd=config_endpoint.gpu_hour_usd)
    given = {
        "prefill_tokens_per_s": args.prefill_tokens_per_s,
        "itl_s": None if args.itl_ms is None else args.itl_ms / 1000,
        "itl_per_seq_s": None if args.itl_per_seq_ms is None else args.itl_per_seq_ms / 1000,
        "decode_tokens_per_s": args.decode_tokens_per_s,
        "overhead_s": None if args.overhead_ms is None else args.overhead_ms / 1000,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "kv_capacity_tokens": args.kv_capacity_tokens,
        "gpus": args.gpus,
        "gpu_hour_usd": args.gpu_hour_usd,
    }
    return dataclasses.replace(d, **{k: v for k, v in given.items() if v is not None})


def serverless_figures(
    args: argparse.Namespace, config_endpoint: ServerlessEndpoint | None
) -> ServerlessCalibration:
    s = calibration.SERVERLESS[args.serverless or calibration.PARTNERS[args.calibration][0]]
    if config_endpoint is not None and (config_endpoint.usd_per_mtok_in or config_endpoint.usd_per_mtok_out):
        s = dataclasses.replace(
            s,
            usd_per_mtok_in=config_endpoint.usd_per_mtok_in,
            usd_per_mtok_out=config_endpoint.usd_per_mtok_out,
        )
    cold = tuple(args.cold_s) if args.cold_s is not None else s.ttft.cold_range_s
    ttft = s.ttft
    if args.serverless_preset is not None:
        ttft = SERVERLESS_PRESETS[args.serverless_preset]
    if args.probe_result is not None:
        ttft = _probe_ttft(args.probe_result, args.probe_endpoint, (cold[0], cold[1]))
    given = {
        "idle_to_cold_s": args.idle_to_cold_s,
        "usd_per_mtok_in": args.usd_per_mtok_in,
        "usd_per_mtok_out": args.usd_per_mtok_out,
        "itl_s": None if args.serverless_itl_ms is None else args.serverless_itl_ms / 1000,
    }
    s = dataclasses.replace(s, ttft=dataclasses.replace(ttft, cold_range_s=(cold[0], cold[1])))
    return dataclasses.replace(s, **{k: v for k, v in given.items() if v is not None})


def _probe_ttft(path: Path, endpoint: str | None, cold: tuple[float, float]) -> TtftDistribution:
    """The serverless TTFT from `tidegate probe --out`'s probe.json (one endpoint's figures)."""
    found = orjson.loads(path.read_bytes())
    rows = [r for r in found.get("endpoints", []) if endpoint is None or r.get("endpoint") == endpoint]
    rows = [r for r in rows if isinstance(r.get("ttft_ms"), dict)]
    if len(rows) != 1:
        names = ", ".join(str(r.get("endpoint")) for r in found.get("endpoints", []))
        raise ValueError(f"{path}: name one endpoint with --probe-endpoint (measured: {names or 'none'})")
    ttft = rows[0]["ttft_ms"]
    return ttft_from_quantiles(float(ttft["median"]), float(ttft["p95"]), cold)
