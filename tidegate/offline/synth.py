"""A week of traffic (or any number of days) with a daily and weekly shape, laid from a real
trace: `tidegate trace synth`.

The public traces are an hour each; the field notes say the economics turn on the hour of the
day, the day of the week, the share of idle time and how long a burst lasts. So the week's
*level* is synthetic and the rest is real:

- **synthetic**: an envelope gives each hour of the week a weight (`office-hours`,
  `two-batch-jobs`, `flat`, or a CSV of 24 or 168 weights), and the volume (requests or tokens
  per day) fixes the scale;
- **real**: each hour of the output is the next hour of the source trace (looped end to end
  every span of it, in whole minutes), rescaled to
  its hour's rate the way `tidegate replay --scale-rate` does it (tidegate/offline/replay.py):
  thinned below the source's rate, superposed copies above it. So within an hour the bursts,
  the idle minutes and every request's (prompt, answer) token sizes are the source's own.

Weights are relative: an hour's expected requests are the day's volume times its weight over
the mean weight of a day. An hour of weight 0 is idle.
"""

from __future__ import annotations

import bisect
import csv
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from router.economics.schedule import HOUR_S, WEEK_HOURS
from tidegate.offline.replay import Arrival, scale_rate


def _office_hours(hour_of_week: int) -> float:
    """Weekdays: a steady baseline 09:00-18:00, shoulders 07:00-09:00 and 18:00-20:00, quiet
    nights; weekends as quiet as the nights."""
    day, hour = divmod(hour_of_week, 24)
    if day >= 5:
        return 0.05
    if 9 <= hour < 18:
        return 1.0
    if 7 <= hour < 9 or 18 <= hour < 20:
        return 0.4
    return 0.05


def _two_batch_jobs(hour_of_week: int) -> float:
    """The field notes' "application B": near idle, with two report jobs a day (02:00 and
    14:00, an hour each), weekends included."""
    return 1.0 if hour_of_week % 24 in (2, 14) else 0.01


ENVELOPES = MappingProxyType(
    {
        "office-hours": tuple(_office_hours(h) for h in range(WEEK_HOURS)),
        "two-batch-jobs": tuple(_two_batch_jobs(h) for h in range(WEEK_HOURS)),
        "flat": (1.0,) * WEEK_HOURS,
    }
)


class EnvelopeError(ValueError):
    """An envelope that cannot be used, with what is wrong with it."""


def envelope(name_or_path: str) -> tuple[float, ...]:
    """168 weights, hour 0 = Monday 00:00: a named envelope, or a CSV file (`hour,weight`, or
    one weight a line) of 24 weights (every day alike) or 168 (the week)."""
    if name_or_path in ENVELOPES:
        return ENVELOPES[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise EnvelopeError(f"--envelope {name_or_path}: neither {', '.join(ENVELOPES)} nor a CSV file")
    weights = _read_weights(path)
    if len(weights) not in (24, WEEK_HOURS):
        raise EnvelopeError(f"{path}: {len(weights)} weights; give 24 (a day) or 168 (a week, Monday first)")
    if any(not math.isfinite(w) or w < 0 for w in weights) or not any(weights):
        raise EnvelopeError(f"{path}: weights must be finite, >= 0, and not all 0")
    return tuple(weights * (WEEK_HOURS // len(weights)))


def _read_weights(path: Path) -> list[float]:
    weights: list[float] = []
    with path.open(encoding="utf-8", newline="") as f:
        for number, row in enumerate(csv.reader(f), start=1):
            cells = [c.strip() for c in row if c.strip()]
            if not cells or cells[0].startswith("#") or (number == 1 and not _is_number(cells[-1])):
                continue  # blank, a comment, or a header line
            if not _is_number(cells[-1]):
                raise EnvelopeError(f"{path}:{number}: {cells[-1]!r} is not a number")
            weights.append(float(cells[-1]))
    return weights


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Volume:
    """How much traffic a day, on average over the days synthesized: requests, or tokens
    (prompt + answer) converted with the source's mean tokens per request."""

    requests_per_day: float

    @staticmethod
    def of_tokens(tokens_per_day: float, source: Sequence[Arrival]) -> Volume:
        mean_tokens = sum(a.input_tokens + a.output_tokens for a in source) / len(source)
        return Volume(tokens_per_day / mean_tokens)


def hour_count(days: float) -> int:
    """How many hours `days` of trace take: a part hour counts whole."""
    return math.ceil(days * 24)


def synthesize(
    source: Sequence[Arrival],
    weights: Sequence[float],
    volume: Volume,
    *,
    days: float = 7.0,
    first_hour_of_week: int = 0,
    seed: int = 0,
) -> Iterator[list[Arrival]]:
    """The synthesized trace an hour at a time, each hour's rows timed from the start (a week
    at a busy rate does not fit in memory as one list). `first_hour_of_week`: where in the week
    the trace starts (0: Monday 00:00). What cannot be synthesized is refused here, at the call,
    before any hour is made."""
    if not source:
        raise ValueError("the source trace has no rows")
    if days <= 0 or volume.requests_per_day <= 0:
        raise ValueError("days and the volume must be > 0")
    hours = hour_count(days)
    mean_weight = sum(weights[(first_hour_of_week + h) % WEEK_HOURS] for h in range(hours)) / hours
    if mean_weight <= 0:
        raise ValueError("the envelope is 0 over the whole span")
    shares = [weights[(first_hour_of_week + h) % WEEK_HOURS] / mean_weight for h in range(hours)]
    return _hours(source, shares, volume, seed)


def _hours(
    source: Sequence[Arrival], shares: list[float], volume: Volume, seed: int
) -> Iterator[list[Arrival]]:
    """Hour h: `shares[h]` (its weight over the mean weight) of a day's volume / 24."""
    period = max(60.0, math.ceil(source[-1].at_s / 60) * 60)
    times = [a.at_s for a in source]
    windows: dict[float, list[Arrival]] = {}  # by where in the loop an hour starts: at most 60
    for h, share in enumerate(shares):
        phase = (h * HOUR_S) % period
        if share > 0 and phase not in windows:
            windows[phase] = _looped(source, times, period, phase)
        window = windows.get(phase, [])
        if share == 0 or not window:
            yield []
            continue
        expected = volume.requests_per_day / 24 * share
        scaled = scale_rate(window, expected / len(window), seed=seed * 1_000_003 + h)
        yield [
            Arrival(h * HOUR_S + a.at_s, a.input_tokens, a.output_tokens) for a in scaled if a.at_s < HOUR_S
        ]


def _looped(source: Sequence[Arrival], times: Sequence[float], period: float, start: float) -> list[Arrival]:
    """The hour from `start` of the source repeated end to end every `period` seconds (its span
    in whole minutes), re-timed from 0."""
    window: list[Arrival] = []
    for tile in range(int(start // period), int((start + HOUR_S) // period) + 1):
        offset = tile * period
        first = bisect.bisect_left(times, start - offset)
        last = bisect.bisect_left(times, start + HOUR_S - offset)
        for a in source[first:last]:
            window.append(Arrival(offset + a.at_s - start, a.input_tokens, a.output_tokens))
    return window


def synthesize_hours(
    source: Sequence[Arrival], requests_per_hour: Sequence[float], *, seed: int = 0
) -> Iterator[list[Arrival]]:
    """Hours of the given expected volumes, one after another (an hour of 0 is idle), each laid
    from the source as `synthesize` lays them: what `tidegate plan --from URL` plans over, the
    volume of each hour a running gateway's own count, the rest the source's."""
    if not source:
        raise ValueError("the source trace has no rows")
    if not requests_per_hour or any(not math.isfinite(r) or r < 0 for r in requests_per_hour):
        raise ValueError("each hour's volume must be a number >= 0")
    mean = sum(requests_per_hour) / len(requests_per_hour)
    if mean <= 0:
        raise ValueError("no requests in any hour")
    return _hours(source, [r / mean for r in requests_per_hour], Volume(mean * 24), seed)
