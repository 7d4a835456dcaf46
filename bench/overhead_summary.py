"""The overhead benchmark's summaries, each from rows measured side by side in one run:
tidegate against the floor (issue 13's targets), today's tree against an earlier one
(`--before`), and maintained Redis clients against our own line (`--clients`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from bench.loadgen import Run, pct


@dataclass(frozen=True)
class Row:
    cpu_ms: float
    added_p50: float
    p50: float
    p99: float
    rps: float


Rows = dict[tuple[str, int, str], Row]  # (path, concurrency, variant)

# issue 13's targets, each against the floor measured in the same run
CPU_TARGETS = {("plain", "memory"): 1.6, ("plain", "redis"): 1.9, ("stream", "memory"): 1.6}  # at c=16
TTFT_TARGETS_MS = {"memory": 0.3, "redis": 0.5}  # added TTFT p50 at c=1, above the floor's
TAIL_TARGET = 1.5  # at c=16: p99/p50 within this multiple of the floor's own p99/p50
BEFORE_LIMIT = 1.05  # issue 27: no row's CPU per request worse than the earlier tree's by more
CLIENT_LIMIT = 1.10  # issue 27: a maintained client is taken if within this of our line's CPU


def print_header() -> None:
    print(
        f"{'path':7} {'conc':>4} {'mode':14} {'req/s':>8} {'lat p50':>8} {'lat p99':>8} "
        f"{'ttft p50':>8} {'ttft p99':>8} {'cpu ms/req':>10} {'added ttft p50':>14} {'p99':>8}"
    )


def print_row(path: str, conc: int, mode: str, run: Run, extra: str) -> None:
    print(
        f"{path:7} {conc:>4} {mode:14} {run.requests / run.seconds:>8.0f} {pct(run.latencies, 0.5):>6.2f}ms "
        f"{pct(run.latencies, 0.99):>6.2f}ms {pct(run.ttfts, 0.5):>6.2f}ms {pct(run.ttfts, 0.99):>6.2f}ms {extra}"
        + (f"  errors={run.errors}" if run.errors else ""),
        flush=True,
    )


def against_floor(rows: Rows, concurrencies: list[int]) -> int:
    """Every tidegate row against the floor's, with issue 13's targets; how many were missed."""
    print("\nsummary: tidegate / floor, measured side by side in this run")
    print(
        f"{'path':7} {'conc':>4} {'mode':14} {'cpu x floor':>11} {'added ttft - floor':>18} "
        f"{'p99/p50':>8} {'floor p99/p50':>13} {'ratio':>6}  targets"
    )
    missed = 0
    for (path, conc, mode), row in sorted(rows.items()):
        floor = rows.get((path, conc, "floor"))
        if floor is None or mode == "floor" or conc not in concurrencies:
            continue
        cpu_ratio = row.cpu_ms / floor.cpu_ms
        added = row.added_p50 - floor.added_p50
        tail, floor_tail = row.p99 / row.p50, floor.p99 / floor.p50
        checks = targets_of(path, conc, mode, cpu_ratio, added, tail / floor_tail)
        missed += sum(not ok for _, ok in checks)
        verdicts = ", ".join(f"{name} {'ok' if ok else 'MISSED'}" for name, ok in checks)
        print(
            f"{path:7} {conc:>4} {mode:14} {cpu_ratio:>10.2f}x {added:>15.3f}ms "
            f"{tail:>8.2f} {floor_tail:>13.2f} {tail / floor_tail:>5.2f}x  {verdicts}"
        )
    print(f"\ntargets missed: {missed}")
    cores = os.cpu_count() or 1
    if cores < 3:
        print(
            f"\n--workers 2 scaling: not measured here ({cores} cores: two workers each on their own core "
            "plus the load generator need 3)"
        )
    return missed


def targets_of(
    path: str, conc: int, mode: str, cpu_ratio: float, added_ms: float, tail_ratio: float
) -> list[tuple[str, bool]]:
    """(target, met) for each of issue 13's targets that applies to this row."""
    checks = []
    if conc == 16 and (path, mode) in CPU_TARGETS:
        limit = CPU_TARGETS[(path, mode)]
        checks.append((f"cpu<={limit}x", cpu_ratio <= limit))
    if conc == 16 and mode in ("memory", "redis"):
        checks.append((f"tail<={TAIL_TARGET}x", tail_ratio <= TAIL_TARGET))
    if conc == 1 and mode in TTFT_TARGETS_MS:
        limit = TTFT_TARGETS_MS[mode]
        checks.append((f"ttft<=+{limit}ms", added_ms <= limit))
    return checks


def against(rows: Rows, pairs: list[tuple[str, str]], limit: float, title: str) -> int:
    """Each (base, other) pair row by row: CPU per request of both, their ratio, the other's
    added TTFT p50 over the base's and its requests/s ratio; a row whose CPU ratio is over
    `limit` is marked. How many were."""
    print(f"\n{title}")
    print(
        f"{'path':7} {'conc':>4} {'mode':14} {'cpu ms/req':>10} {'base':>14} {'base ms':>8} {'ratio':>7} "
        f"{'ttft +ms':>8} {'req/s':>6}  verdict"
    )
    over = 0
    for path in ("plain", "stream"):
        for conc in sorted({c for p, c, _ in rows if p == path}):
            for base, other in pairs:
                row, reference = rows.get((path, conc, other)), rows.get((path, conc, base))
                if row is None or reference is None:
                    continue
                ratio = row.cpu_ms / reference.cpu_ms
                over += ratio > limit
                verdict = f"within {limit:.2f}x" if ratio <= limit else f"OVER {limit:.2f}x"
                print(
                    f"{path:7} {conc:>4} {other:14} {row.cpu_ms:>10.3f} {base:>14} {reference.cpu_ms:>8.3f} "
                    f"{ratio:>6.2f}x {row.added_p50 - reference.added_p50:>+8.3f} "
                    f"{row.rps / reference.rps:>5.2f}x  {verdict}"
                )
    return over
