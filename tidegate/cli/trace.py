"""`tidegate trace synth`: days of traffic with a daily and weekly shape, laid from a real
trace (tidegate/offline/synth.py says what is synthetic in it and what is real), written as an
Azure-format CSV that `tidegate replay` and `tidegate plan` read as they read the public
traces.

    tidegate trace synth --from AzureLLMInferenceTrace_conv.csv --envelope office-hours \\
        --days 7 --tokens-per-day 50e6 --out week.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from router.cli.options import add_options, option
from tidegate.cli.progress import counting
from tidegate.offline import synth
from tidegate.offline.replay import AZURE_COLUMNS, FORMATS, Arrival, azure_row, load

_MONDAY = "2026-01-05T00:00"  # a Monday: hour 0 of the week

_SYNTH_OPTIONS = (
    option("--from", dest="source", type=Path, required=True, metavar="TRACE", help="the real trace to lay"),
    option("--format", choices=FORMATS, help="the source's format (default: detected)"),
    option(
        "--envelope",
        default="office-hours",
        help=f"{', '.join(synth.ENVELOPES)}, or a CSV of 24 or 168 hourly weights (Monday 00:00 first)",
    ),
    option("--days", type=float, default=7.0, help="how many days to write"),
    option("--requests-per-day", type=float, help="the volume, as requests a day (mean over the days)"),
    option("--tokens-per-day", type=float, help="the volume, as prompt + answer tokens a day"),
    option(
        "--start", default=_MONDAY, help="the first row's date and hour (its weekday places the envelope)"
    ),
    option("--seed", type=int, default=0),
    option("--out", type=Path, required=True, help="the CSV to write (Azure format)"),
)


def add_parser(commands: Any) -> None:
    trace = commands.add_parser("trace", help="make traces to replay and plan with")
    verbs = trace.add_subparsers(required=True, metavar="VERB")
    synth_cmd = verbs.add_parser(
        "synth",
        help="days of traffic with a daily and weekly shape, laid from a real trace",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(synth_cmd, _SYNTH_OPTIONS)
    synth_cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    if args.days <= 0:
        print("tidegate trace synth: --days must be > 0", file=sys.stderr)
        return 2
    try:
        start = datetime.fromisoformat(args.start)
        weights = synth.envelope(args.envelope)
        source = load(args.source, args.format)
        volume = _volume(args, source)
        first_hour = start.weekday() * 24 + start.hour
        hours = synth.synthesize(
            source, weights, volume, days=args.days, first_hour_of_week=first_hour, seed=args.seed
        )
    except (ValueError, OSError) as exc:
        print(f"tidegate trace synth: {exc}", file=sys.stderr)
        return 2
    written = _write(args.out, start.replace(minute=0, second=0, microsecond=0), hours, args.days, console)
    _summary(written, args, volume, console)
    return 0


def _volume(args: argparse.Namespace, source: Sequence[Arrival]) -> synth.Volume:
    if (args.requests_per_day is None) == (args.tokens_per_day is None):
        raise ValueError("give the volume as --requests-per-day or --tokens-per-day (one of them)")
    asked = args.requests_per_day if args.requests_per_day is not None else args.tokens_per_day
    if not asked > 0:
        raise ValueError("the volume must be > 0")
    if args.requests_per_day is not None:
        return synth.Volume(args.requests_per_day)
    return synth.Volume.of_tokens(args.tokens_per_day, source)


def _write(
    out: Path, start: datetime, hours: Iterator[list[Arrival]], days: float, console: Console
) -> list[tuple[int, int]]:
    """Write every hour's rows; (requests, tokens) of each hour."""
    written: list[tuple[int, int]] = []
    with (
        out.open("w", encoding="utf-8", newline="") as f,
        counting(console, "synthesizing hours", synth.hour_count(days)) as advance,
    ):
        writer = csv.writer(f)
        writer.writerow(AZURE_COLUMNS)
        for hour in hours:
            writer.writerows(azure_row(start, a) for a in hour)
            written.append((len(hour), sum(a.input_tokens + a.output_tokens for a in hour)))
            advance(1)
    return written


def _summary(
    written: list[tuple[int, int]], args: argparse.Namespace, volume: synth.Volume, console: Console
) -> None:
    requests = sum(r for r, _ in written)
    tokens = sum(t for _, t in written)
    busiest = max(range(len(written)), key=lambda h: written[h][0])
    idle = sum(1 for r, _ in written if r == 0)
    print(
        f"wrote {requests:,} requests over {args.days:g} days to {args.out}: "
        f"{requests / args.days:,.0f} requests and {tokens / args.days:,.0f} tokens a day "
        f"(asked: {volume.requests_per_day:,.0f} requests)"
    )
    print(
        f"busiest hour: #{busiest} with {written[busiest][0]:,} requests; idle hours: {idle} of "
        f"{len(written)}; envelope {args.envelope} (synthetic), request sizes and in-hour bursts from "
        f"{args.source.name} (real)"
    )
