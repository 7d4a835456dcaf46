"""`tidegate sim`: one simulated OpenAI-compatible upstream (router/sim/), dedicated or
serverless, from its defaults, a named calibration (router/offline/calibration.py) and flags."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from router.cli.serving import Served, bind
from router.cli.serving import run as serve
from router.offline import calibration
from router.sim.profile import SERVERLESS_PRESETS, Faults, Kind, SimProfile


def add_parser(commands: Any) -> None:
    d = SimProfile()
    f = Faults()
    sim = commands.add_parser(
        "sim",
        help="run one simulated OpenAI-compatible upstream",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sim.add_argument("--profile", choices=[k.value for k in Kind], default="dedicated")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=9000)
    sim.add_argument("--name", default="sim", help="model id the simulator reports")
    sim.add_argument("--time-scale", type=float, default=d.time_scale, help="run X times faster")
    sim.add_argument("--seed", type=int, default=None)
    sim.add_argument("--default-output-tokens", type=int, default=d.default_output_tokens)
    sim.add_argument(
        "--answer-tokens-p50",
        type=int,
        default=200,
        help="median answer length; one shorter than max_tokens ends with finish_reason stop "
        "(0: run every answer to max_tokens)",
    )
    sim.add_argument(
        "--tool-call-share", type=float, default=d.tool_call_share, help='with tools and tool_choice "auto"'
    )
    sim.add_argument(
        "--served-model",
        action="append",
        default=[],
        help="a model id it serves (repeat); others get 404. Default: any",
    )
    sim.add_argument(
        "--calibration",
        choices=sorted(set(calibration.DEDICATED) | set(calibration.SERVERLESS)),
        help="start from a published calibration (router/offline/calibration.py); flags override its figures",
    )
    sim.add_argument(
        "--max-concurrency",
        type=int,
        help=f"dedicated: sequences served at once; the rest queue FIFO (default {d.max_concurrency})",
    )
    sim.add_argument("--prefill-tokens-per-s", type=float, help=f"default {d.prefill_tokens_per_s:g}")
    sim.add_argument(
        "--itl-ms",
        type=float,
        help=f"dedicated: inter-token latency in a small batch (default {d.itl_s * 1000:g})",
    )
    sim.add_argument(
        "--itl-per-seq-ms", type=float, help="dedicated: decode step growth per running sequence (default 0)"
    )
    sim.add_argument(
        "--decode-tokens-per-s",
        type=float,
        help=f"dedicated: aggregate decode rate shared by the batch (default {d.decode_tokens_per_s:g})",
    )
    sim.add_argument("--overhead-ms", type=float, help="dedicated: fixed part of TTFT (default 0)")
    sim.add_argument(
        "--preset",
        choices=sorted(SERVERLESS_PRESETS),
        default="deepseek-a",
        help="serverless: TTFT distribution from the field notes",
    )
    sim.add_argument("--serverless-itl-ms", type=float, help=f"default {d.serverless_itl_s * 1000:g}")
    sim.add_argument(
        "--idle-to-cold-s",
        type=float,
        help="serverless: cold start after this idle gap (default 0: never)",
    )
    sim.add_argument(
        "--cold-s",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="serverless: a cold load takes between these (default: the preset's)",
    )
    sim.add_argument(
        "--tokens-per-write",
        type=int,
        default=d.tokens_per_write,
        help="a stream sends its events this many at a time (fewer writes for long replays)",
    )
    sim.add_argument("--error-rate", type=float, default=f.error_rate, help="share answered 500/503")
    sim.add_argument(
        "--rate-limit-rate", type=float, default=f.rate_limit_rate, help="share answered 429 with Retry-After"
    )
    sim.add_argument("--retry-after-s", type=float, default=f.retry_after_s)
    sim.add_argument(
        "--stall-rate",
        type=float,
        default=f.stall_rate,
        help="share that stall --stall-s before the first byte",
    )
    sim.add_argument("--stall-s", type=float, default=f.stall_s)
    sim.add_argument(
        "--cut-rate", type=float, default=f.cut_rate, help="share of streams whose connection drops halfway"
    )
    sim.add_argument(
        "--reject-rate", type=float, default=f.reject_rate, help="share answered 400 (context length)"
    )
    sim.set_defaults(run=run)


def sim_profile(args: argparse.Namespace) -> SimProfile:
    """The profile the flags describe: SimProfile's defaults, then the calibration's figures,
    then every flag given."""
    kind = Kind(args.profile)
    profile = SimProfile(
        kind=kind,
        name=args.name,
        time_scale=args.time_scale,
        seed=args.seed,
        default_output_tokens=args.default_output_tokens,
        answer_tokens_p50=args.answer_tokens_p50 or None,
        tool_call_share=args.tool_call_share,
        served_models=tuple(args.served_model),
        ttft=SERVERLESS_PRESETS[args.preset],
        tokens_per_write=args.tokens_per_write,
        faults=Faults(
            args.error_rate,
            args.rate_limit_rate,
            args.retry_after_s,
            args.stall_rate,
            args.stall_s,
            args.cut_rate,
            args.reject_rate,
        ),
    )
    if args.calibration is not None:
        profile = _calibrated(profile, args.calibration)
    given = {
        "max_concurrency": args.max_concurrency,
        "prefill_tokens_per_s": args.prefill_tokens_per_s,
        "itl_s": _seconds(args.itl_ms),
        "itl_per_seq_s": _seconds(args.itl_per_seq_ms),
        "decode_tokens_per_s": args.decode_tokens_per_s,
        "overhead_s": _seconds(args.overhead_ms),
        "serverless_itl_s": _seconds(args.serverless_itl_ms),
        "idle_to_cold_s": args.idle_to_cold_s,
    }
    profile = dataclasses.replace(profile, **{k: v for k, v in given.items() if v is not None})
    if args.cold_s is not None:
        low, high = args.cold_s
        if not 0 <= low <= high:
            raise ValueError("--cold-s MIN MAX needs 0 <= MIN <= MAX")
        profile = dataclasses.replace(
            profile, ttft=dataclasses.replace(profile.ttft, cold_range_s=(low, high))
        )
    return profile


def _calibrated(profile: SimProfile, name: str) -> SimProfile:
    if profile.kind is Kind.DEDICATED:
        if name not in calibration.DEDICATED:
            raise ValueError(f"--calibration {name} is a serverless calibration; this is a dedicated sim")
        d = calibration.DEDICATED[name]
        return dataclasses.replace(
            profile,
            max_concurrency=d.max_num_seqs,
            prefill_tokens_per_s=d.prefill_tokens_per_s,
            itl_s=d.itl_s,
            itl_per_seq_s=d.itl_per_seq_s,
            decode_tokens_per_s=d.decode_tokens_per_s,
            overhead_s=d.overhead_s,
        )
    if name not in calibration.SERVERLESS:
        raise ValueError(f"--calibration {name} is a dedicated calibration; this is a serverless sim")
    s = calibration.SERVERLESS[name]
    return dataclasses.replace(
        profile, ttft=s.ttft, serverless_itl_s=s.itl_s, idle_to_cold_s=s.idle_to_cold_s
    )


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def run(args: argparse.Namespace) -> int:
    from router.sim.app import create_sim_app  # noqa: PLC0415 (lazy: the gateway does not need it)

    try:
        profile = sim_profile(args)
    except ValueError as exc:
        print(f"tidegate sim: {exc}", file=sys.stderr)
        return 2
    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    print(f"tidegate sim ({profile.kind}) listening on http://{host}:{port}/v1", flush=True)
    serve(Served(create_sim_app(profile), sock))
    return 0
