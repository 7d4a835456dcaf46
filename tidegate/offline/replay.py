"""Traces for `tidegate replay`: load, cut, rescale; and the summary of a replay.

A trace is a list of arrivals (seconds from its first row, input tokens, output tokens), from
the Azure LLM inference CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`), the Mooncake JSONL
(`timestamp` in ms, `input_length`, `output_length`) or tidegate's own access log (one JSON
line per request, with `at`, `e2e_ms` and the measured tokens), so a team can replay its own
production traffic.

`scale_rate` multiplies the arrival rate without flattening its bursts: below 1 it thins the
trace (each row kept with probability x); above 1 it superposes copies of it shifted by at most
a second, plus a thinned copy for the fraction. Peaks, the share of idle minutes and the shape
of a burst stay what they were, scaled (a circular shift by a random offset would fill the idle
minutes with another copy's bursts).
"""

from __future__ import annotations

import csv
import math
import random
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from policies.base import Reason
from router.economics.cost import token_cost_usd
from tidegate.offline.stats import percentile, percentiles

FORMATS = ("azure", "mooncake", "access-log")


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float  # seconds since the trace's first row
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class BlockArrival(Arrival):
    """A Mooncake row: its prompt's blocks of MOONCAKE_BLOCK_TOKENS by hash id, so two rows that
    share leading ids share a prompt prefix (a subclass: Azure rows stay as small as they were)."""

    blocks: tuple[int, ...] = ()


MOONCAKE_BLOCK_TOKENS = 512  # the trace's hash_ids each name this many prompt tokens
MOONCAKE_TICK_S = 3.0  # its timestamps are quantised to ticks this long


def detect(path: Path) -> str:
    """The trace format from its first line."""
    with path.open(encoding="utf-8") as f:
        first = f.readline()
    if first.startswith("TIMESTAMP"):
        return "azure"
    if '"input_length"' in first:
        return "mooncake"
    if '"e2e_ms"' in first:
        return "access-log"
    raise ValueError(f"{path}: not an Azure CSV, a Mooncake JSONL or a tidegate access log")


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")  # an Azure CSV's header


def azure_row(start: datetime, a: Arrival) -> tuple[str, int, int]:
    """The arrival as a row of an Azure CSV whose clock starts at `start` (what `load` reads)."""
    at = start + timedelta(seconds=a.at_s)
    return at.strftime("%Y-%m-%d %H:%M:%S.%f"), a.input_tokens, a.output_tokens


def azure_time(stamp: str) -> datetime:
    """An Azure CSV TIMESTAMP (seven decimals of seconds: Python reads six)."""
    return datetime.fromisoformat(stamp[:26])


def first_azure_time(path: Path) -> datetime | None:
    """When an Azure CSV's first row was sent (None: no rows)."""
    with path.open(encoding="utf-8", newline="") as f:
        first = next(csv.DictReader(f), None)
    return None if first is None else azure_time(first["TIMESTAMP"])


def load(path: Path, fmt: str | None = None) -> list[Arrival]:
    """Every row of a trace, in arrival order, times from its first row."""
    fmt = fmt or detect(path)
    rows: list[tuple[float, int, int]] = []
    if fmt == "azure":
        with path.open(encoding="utf-8", newline="") as f:
            rows = list(_azure_rows(f))
    elif fmt == "mooncake":
        return _mooncake(path)
    elif fmt == "access-log":
        for line in path.read_bytes().splitlines():
            found = _access_line(line)
            if found is not None:
                rows.append(found)
    else:
        raise ValueError(f"unknown trace format {fmt!r}; one of {', '.join(FORMATS)}")
    if not rows:
        raise ValueError(f"{path}: no rows")
    if any(rows[i][0] > rows[i + 1][0] for i in range(len(rows) - 1)):
        rows.sort()
    first = rows[0][0]
    return [Arrival(at - first, max(1, n_in), max(1, n_out)) for at, n_in, n_out in rows]


def _mooncake(path: Path) -> list[Arrival]:
    """A Mooncake JSONL's rows with their block ids. The timestamps are quantised (several rows
    share one tick): the rows of a tick are spread evenly over it, in file order, so a replay
    does not send them as one burst the real traffic never was."""
    rows = []
    for order, line in enumerate(path.read_bytes().splitlines()):
        found = orjson.loads(line)
        blocks = tuple(int(h) for h in found.get("hash_ids") or ())
        rows.append(
            (
                found["timestamp"] / 1000,
                order,
                int(found["input_length"]),
                int(found["output_length"]),
                blocks,
            )
        )
    if not rows:
        raise ValueError(f"{path}: no rows")
    rows.sort()
    first, i = rows[0][0], 0
    out: list[Arrival] = []
    while i < len(rows):
        j = i
        while j < len(rows) and rows[j][0] == rows[i][0]:
            j += 1
        gap = (rows[j][0] - rows[i][0]) if j < len(rows) else MOONCAKE_TICK_S
        step = min(gap, MOONCAKE_TICK_S) / (j - i)
        for k in range(i, j):
            at, _, n_in, n_out, blocks = rows[k]
            out.append(BlockArrival(at - first + (k - i) * step, max(1, n_in), max(1, n_out), blocks))
        i = j
    return out


def _azure_rows(lines: Iterable[str]) -> Iterator[tuple[float, int, int]]:
    """(epoch seconds, prompt tokens, answer tokens) per row. A week of traffic at a busy rate
    is tens of millions of rows: the date's epoch is computed once per day and the clock read
    from its fixed columns (`azure_time` for anything else)."""
    reader = csv.reader(lines)
    header = next(reader, None) or []
    try:
        at, prompt, answer = (header.index(k) for k in AZURE_COLUMNS)
    except ValueError:
        raise ValueError("an Azure CSV needs TIMESTAMP, ContextTokens and GeneratedTokens columns") from None
    days: dict[str, float] = {}
    for row in reader:
        stamp = row[at]
        day = days.get(stamp[:10])
        if day is None:
            day = days[stamp[:10]] = datetime.fromisoformat(stamp[:10]).replace(tzinfo=UTC).timestamp()
        if len(stamp) >= 19 and stamp[13] == ":" and stamp[16] == ":":
            clock = int(stamp[11:13]) * 3600 + int(stamp[14:16]) * 60 + float(stamp[17:26])
            yield day + clock, int(row[prompt]), int(row[answer])
        else:
            stated = azure_time(stamp)
            stated = stated if stated.tzinfo else stated.replace(tzinfo=UTC)
            yield stated.timestamp(), int(row[prompt]), int(row[answer])


def _access_line(line: bytes) -> tuple[float, int, int] | None:
    start = line.find(b"{")
    if start < 0:
        return None
    try:
        found = orjson.loads(line[start:])
    except orjson.JSONDecodeError:
        return None
    measures = found.get("measures") or {}
    if not isinstance(found.get("at"), int | float):
        return None
    arrived = found["at"] - (found.get("e2e_ms") or 0) / 1000
    return arrived, int(measures.get("input_tokens") or 1), int(measures.get("output_tokens") or 1)


def window(arrivals: Sequence[Arrival], start_min: float, minutes: float | None) -> list[Arrival]:
    """The rows from minute `start_min` for `minutes` (all the rest with None), re-timed from 0."""
    begin = start_min * 60
    end = math.inf if minutes is None else begin + minutes * 60
    if begin == 0 and end == math.inf:
        return list(arrivals)  # the whole trace: no copy of every row
    return [_at(a, a.at_s - begin) for a in arrivals if begin <= a.at_s < end]


def _at(a: Arrival, at_s: float) -> Arrival:
    """`a` re-timed, its blocks kept."""
    if isinstance(a, BlockArrival):
        return BlockArrival(at_s, a.input_tokens, a.output_tokens, a.blocks)
    return Arrival(at_s, a.input_tokens, a.output_tokens)


def scale_rate(
    arrivals: Sequence[Arrival], factor: float, seed: int = 0, jitter_s: float = 1.0
) -> list[Arrival]:
    """The trace at `factor` times its arrival rate (see the module doc): each row is sent
    int(factor) times plus once more with probability factor - int(factor), every extra copy
    `jitter_s` or less after the original, so every minute holds `factor` times its requests
    and idle minutes stay idle."""
    if factor <= 0:
        raise ValueError("--scale-rate must be > 0")
    if factor == 1:
        return list(arrivals)  # every row once, unshifted: the trace as it is
    rng = random.Random(seed)
    whole, fraction = int(factor), factor - int(factor)
    out: list[Arrival] = []
    for a in arrivals:
        copies = whole + (1 if rng.random() < fraction else 0)
        for copy in range(copies):
            shift = 0.0 if copy == 0 else rng.uniform(0, jitter_s)
            out.append(_at(a, a.at_s + shift))
    return sorted(out, key=lambda a: a.at_s)


def per_minute(arrivals: Iterable[Arrival], minutes: int) -> list[int]:
    counts = [0] * max(1, minutes)
    for a in arrivals:
        index = int(a.at_s // 60)
        if index < len(counts):
            counts[index] += 1
    return counts


def _percentile(values: Sequence[float], q: float) -> float | None:
    return percentile(values, q) if values else None


SPILL_REASONS = frozenset(r.value for r in Reason if r.is_spill)


@dataclass(frozen=True, slots=True)
class Pricing:
    """What the routes of a replay (or a plan) cost: dedicated by provisioned time, busy or
    idle (router/economics/cost.py), serverless by the tokens of the requests it served."""

    dedicated_usd_per_hour: float  # every dedicated replica together
    dedicated_slots: int  # every dedicated replica's max_concurrency together
    dedicated_routes: frozenset[str]
    serverless_usd_per_mtok: Mapping[str, tuple[float, float]]  # route -> (input, output)
    keep_warm_usd: float = 0.0  # keep-warm pings over the window: spend, not tasks


def costs(records: Sequence[dict[str, Any]], pricing: Pricing, span_s: float) -> dict[str, Any]:
    """Cost, cost per SLO-successful task's inputs and dedicated utilization (slot-seconds
    used over slot-seconds provisioned) of answered requests over a trace `span_s` long."""
    tokens: dict[str, list[int]] = {}  # per serverless route: (prompt, answer) tokens it served
    busy_s = 0.0
    dedicated, priced = pricing.dedicated_routes, pricing.serverless_usd_per_mtok
    for r in records:
        if not r.get("ok"):
            continue
        route = r.get("route") or "-"
        if route in dedicated:  # slot time inside the span: what was paid for
            at = float(r.get("at_s") or 0.0)
            held_from = float(r.get("admitted_s", at))  # a batch request held its slot after its wait
            busy_s += max(0.0, min(at + (r.get("e2e_ms") or 0.0) / 1000, span_s) - held_from)
            continue
        counted = tokens.get(route)
        if counted is None:
            if route not in priced:
                raise ValueError(
                    f"route {route!r} answered but is not in the pricing (is the config the gateway's?)"
                )
            counted = tokens[route] = [0, 0]
        counted[0] += r["input_tokens"]
        counted[1] += r["output_tokens"]
    serverless_usd = sum(token_cost_usd(i, o, *priced[route]) for route, (i, o) in tokens.items())
    dedicated_usd = pricing.dedicated_usd_per_hour * span_s / 3600
    provisioned = pricing.dedicated_slots * span_s
    return {
        "span_s": span_s,
        "dedicated_usd": round(dedicated_usd, 6),
        "serverless_usd": round(serverless_usd, 6),
        "keep_warm_usd": round(pricing.keep_warm_usd, 6),
        "cost_usd": round(dedicated_usd + serverless_usd + pricing.keep_warm_usd, 6),
        "dedicated_utilization": round(busy_s / provisioned, 4) if provisioned > 0 else None,
    }


def summary(
    records: Sequence[dict[str, Any]],
    slo_ttft_ms: float,
    lag_p99_ms: float,
    pricing: Pricing | None = None,
    span_s: float | None = None,
) -> dict[str, Any]:
    """What a replay measured (or a plan predicted: the same records, the same figures). A
    replay whose sender fell behind its schedule (send lag p99 over `lag_p99_ms`) measured
    the client, not the system: it is marked invalid. With `pricing` and the trace's
    `span_s`, also its cost, cost per SLO-successful task and dedicated utilization. Records
    marked `batch` (the planner's batch share) are out of the TTFT figures; one answered
    within its wait is a success, and its cost counts."""
    batch = [r for r in records if r.get("batch")]  # the planner's batch share: no TTFT SLO
    everything, records = records, [r for r in records if not r.get("batch")] if batch else records
    sent = [r for r in records if r.get("sent")]
    ok = [r for r in sent if r.get("ok")]
    answered = _Answered(ok, slo_ttft_ms)
    ttft, within, routes, spilled = answered.ttft, answered.within, answered.routes, answered.spilled
    p50, p95, p99 = percentiles(ttft, (50, 95, 99)) if ttft else (None, None, None)
    lags = [r["lag_ms"] for r in sent]
    worst = answered.worst_minute()
    lag_p99 = (_percentile(lags, 99) or 0.0) if any(lags) else 0.0  # a model's records: no lag
    found: dict[str, Any] = {
        "requests": len(records),
        "sent": len(sent),
        "succeeded": len(ok),
        "errors": len(sent) - len(ok),
        "not_sent": len(records) - len(sent),
        "slo_ttft_ms": slo_ttft_ms,
        "slo_attainment": round(within / len(records), 4) if records else None,
        "ttft_ms": {
            "p50": _round(p50),
            "p95": _round(p95),
            "p99": _round(p99),
            "worst_minute": None
            if worst is None
            else {"minute": worst[0], "p95": _round(_percentile(worst[1], 95))},
        },
        "spill_share": round(spilled / len(ok), 4) if ok else None,
        "routes": routes,
        "send_lag_ms": {"p99": round(lag_p99, 2), "max": round(max(lags, default=0.0), 2)},
        "client_kept_up": lag_p99 <= lag_p99_ms and len(sent) == len(records),
        "mean_input_tokens": round(statistics.fmean([r["input_tokens"] for r in records]), 1)
        if records
        else None,
    }
    done = [r for r in batch if r.get("ok")]  # a batch request succeeds when answered within its wait
    if batch:
        found["batch"] = _batch_summary(batch, done)
    if pricing is not None and span_s is not None:
        found |= costs(everything, pricing, span_s)
        successes = within + len(done)
        found["cost_per_slo_success_usd"] = round(found["cost_usd"] / successes, 8) if successes else None
    return found


class _Answered:
    """One pass over the answered requests: their TTFTs (overall and by trace minute), how many
    were within the SLO, the routes they took and how many spilled."""

    def __init__(self, ok: Sequence[dict[str, Any]], slo_ttft_ms: float) -> None:
        self.ttft: list[float] = []
        self.minutes: dict[int, list[float]] = {}
        self.routes: dict[str, int] = {}
        self.within = self.spilled = 0
        ttfts, minutes, routes = self.ttft, self.minutes, self.routes
        spilled = 0
        for r in ok:  # a week of requests per plan: the loop keeps its names local
            ttft = r.get("ttft_ms")
            if ttft is not None:
                ttfts.append(ttft)
                minute = int(r["at_s"] // 60)
                found = minutes.get(minute)
                if found is None:
                    minutes[minute] = [ttft]
                else:
                    found.append(ttft)
            route = r.get("route") or "-"
            routes[route] = routes.get(route, 0) + 1
            spilled += r.get("reason") in SPILL_REASONS
        self.within = sum(1 for ttft in ttfts if ttft <= slo_ttft_ms)
        self.spilled = spilled

    def worst_minute(self) -> tuple[int, list[float]] | None:
        """The trace minute whose answered requests had the highest p95 TTFT, and its TTFTs."""
        return max(self.minutes.items(), key=lambda m: _percentile(m[1], 95) or 0.0, default=None)


def _batch_summary(batch: Sequence[dict[str, Any]], done: Sequence[dict[str, Any]]) -> dict[str, int]:
    on_dedicated = sum(1 for r in done if r.get("reason") == "batch")
    return {"requests": len(batch), "answered": len(done), "on_dedicated": on_dedicated}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
