"""The figures `tidegate plan` models with: a named calibration, at a gateway config's prices,
overridden by each engine or price flag, and a serverless TTFT from a preset or a `tidegate
probe` result (the fitting is tidegate/offline/fitting.py's; the flags are here)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import orjson

from router.config import DedicatedEndpoint, ServerlessEndpoint
from tidegate.offline import calibration
from tidegate.offline.calibration import (
    SERVERLESS_PRESETS,
    DedicatedCalibration,
    ServerlessCalibration,
    TtftDistribution,
)
from tidegate.offline.fitting import probe_ttft, with_config_prices, with_token_prices


def dedicated_figures(
    args: argparse.Namespace, config_endpoint: DedicatedEndpoint | None
) -> DedicatedCalibration:
    d = with_config_prices(calibration.DEDICATED[args.calibration], config_endpoint)
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
    named = calibration.SERVERLESS[args.serverless or calibration.PARTNERS[args.calibration][0]]
    s = with_token_prices(named, config_endpoint)
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
    try:
        return probe_ttft(orjson.loads(path.read_bytes()), endpoint, cold)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
