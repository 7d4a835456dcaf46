"""`tidegate sim`: one simulated OpenAI-compatible upstream (tidegate/sim/), dedicated or
serverless, from its defaults, a named calibration (tidegate/offline/calibration.py) and flags."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from router.cli.options import add_options, option
from router.cli.serving import Served, bind, cannot_listen
from router.cli.serving import run as serve
from tidegate.offline import calibration
from tidegate.sim.profile import SERVERLESS_PRESETS, Faults, Kind, Persona, SimProfile

_D, _F = SimProfile(), Faults()  # the defaults the options show
_OPTIONS = (
    option("--profile", choices=[k.value for k in Kind], default="dedicated"),
    option("--host", default="127.0.0.1"),
    option("--port", type=int, default=9000),
    option("--name", default="sim", help="model id the simulator reports"),
    option("--time-scale", type=float, default=_D.time_scale, help="run X times faster"),
    option("--seed", type=int, default=None),
    option("--default-output-tokens", type=int, default=_D.default_output_tokens),
    option(
        "--answer-tokens-p50",
        type=int,
        default=200,
        help="median answer length; one shorter than max_tokens ends with finish_reason stop "
        "(0: run every answer to max_tokens)",
    ),
    option(
        "--tool-call-share", type=float, default=_D.tool_call_share, help='with tools and tool_choice "auto"'
    ),
    option(
        "--served-model",
        action="append",
        default=[],
        help="a model id it serves (repeat); others get 404. Default: any",
    ),
    option(
        "--calibration",
        choices=sorted(set(calibration.DEDICATED) | set(calibration.SERVERLESS)),
        help="start from a published calibration (tidegate/offline/calibration.py); flags override it",
    ),
    option(
        "--max-concurrency",
        type=int,
        help=f"dedicated: sequences served at once; the rest queue FIFO (default {_D.max_concurrency})",
    ),
    option("--prefill-tokens-per-s", type=float, help=f"default {_D.prefill_tokens_per_s:g}"),
    option(
        "--itl-ms",
        type=float,
        help=f"dedicated: inter-token latency in a small batch (default {_D.itl_s * 1000:g})",
    ),
    option(
        "--itl-per-seq-ms", type=float, help="dedicated: decode step growth per running sequence (default 0)"
    ),
    option(
        "--decode-tokens-per-s",
        type=float,
        help=f"dedicated: aggregate decode rate shared by the batch (default {_D.decode_tokens_per_s:g})",
    ),
    option("--overhead-ms", type=float, help="dedicated: fixed part of TTFT (default 0)"),
    option(
        "--max-num-batched-tokens",
        type=int,
        help=f"dedicated: tokens a step carries, prompt chunks too (default {_D.max_num_batched_tokens})",
    ),
    option("--kv-capacity-tokens", type=float, help="dedicated: the KV cache in tokens (default: unbounded)"),
    option(
        "--prefix-cache-tokens",
        type=int,
        help="dedicated: a prefix cache of this many tokens (default: none)",
    ),
    option(
        "--preset",
        choices=sorted(SERVERLESS_PRESETS),
        default="deepseek-a",
        help="serverless: TTFT distribution from the field notes",
    ),
    option("--serverless-itl-ms", type=float, help=f"default {_D.serverless_itl_s * 1000:g}"),
    option(
        "--idle-to-cold-s",
        type=float,
        help="serverless: cold start after this idle gap (default 0: never)",
    ),
    option(
        "--cold-s",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="serverless: a cold load takes between these (default: the preset's)",
    ),
    option(
        "--tokens-per-write",
        type=int,
        default=_D.tokens_per_write,
        help="a stream sends its events this many at a time (fewer writes for long replays)",
    ),
    option("--error-rate", type=float, default=_F.error_rate, help="share answered 500/503"),
    option(
        "--rate-limit-rate",
        type=float,
        default=_F.rate_limit_rate,
        help="share answered 429 with Retry-After",
    ),
    option("--retry-after-s", type=float, default=_F.retry_after_s),
    option(
        "--stall-rate",
        type=float,
        default=_F.stall_rate,
        help="share that stall --stall-s before the first byte",
    ),
    option("--stall-s", type=float, default=_F.stall_s),
    option(
        "--cut-rate", type=float, default=_F.cut_rate, help="share of streams whose connection drops halfway"
    ),
    option("--reject-rate", type=float, default=_F.reject_rate, help="share answered 400 (context length)"),
    option(
        "--persona",
        choices=[p.value for p in Persona],
        default=_D.persona.value,
        help="how its answers diverge from a faithful model's (docs/parity.md)",
    ),
    option(
        "--persona-share",
        type=float,
        default=_D.persona_share,
        help="the share of requests the persona drifts on (decided by a hash of --seed and the body)",
    ),
)


def add_parser(commands: Any) -> None:
    sim = commands.add_parser(
        "sim",
        help="run one simulated OpenAI-compatible upstream",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_options(sim, _OPTIONS)
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
        persona=Persona(args.persona),
        persona_share=args.persona_share,
    )
    if not 0 <= args.persona_share <= 1:
        raise ValueError("--persona-share must be from 0 to 1")
    if args.prefix_cache_tokens is not None and args.prefix_cache_tokens < 0:
        raise ValueError("--prefix-cache-tokens must be 0 or more")
    if args.calibration is not None:
        profile = _calibrated(profile, args.calibration)
    given = {
        "max_concurrency": args.max_concurrency,
        "prefill_tokens_per_s": args.prefill_tokens_per_s,
        "itl_s": _seconds(args.itl_ms),
        "itl_per_seq_s": _seconds(args.itl_per_seq_ms),
        "decode_tokens_per_s": args.decode_tokens_per_s,
        "overhead_s": _seconds(args.overhead_ms),
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "kv_capacity_tokens": args.kv_capacity_tokens,
        "prefix_cache_tokens": args.prefix_cache_tokens,
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
            max_num_batched_tokens=d.max_num_batched_tokens,
            kv_capacity_tokens=d.kv_capacity_tokens,
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
    from tidegate.sim.app import create_sim_app  # noqa: PLC0415 (lazy: the gateway does not need it)

    try:
        profile = sim_profile(args)
    except ValueError as exc:
        print(f"tidegate sim: {exc}", file=sys.stderr)
        return 2
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        print(cannot_listen(args.host, args.port, exc, "--port"), file=sys.stderr)
        return 2
    host, port = sock.getsockname()[:2]
    print(f"tidegate sim ({profile.kind}) listening on http://{host}:{port}/v1", flush=True)
    serve(Served(create_sim_app(profile), sock))
    return 0
