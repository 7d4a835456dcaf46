"""Traces for `tidegate replay`: the three formats load, a window cuts, and --scale-rate keeps
the burst shape (peak/mean per minute, the share of idle minutes) on the real Azure traces."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import orjson
import pytest

from tidegate.offline.replay import (
    MOONCAKE_BLOCK_TOKENS,
    Arrival,
    BlockArrival,
    load,
    per_minute,
    scale_rate,
    summary,
    window,
)

# The first 20 minutes of the public Azure LLM inference traces (2023), kept in the repository
TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
CODE = TRACES / "AzureLLMInferenceTrace_code_20min.csv"
CONV = TRACES / "AzureLLMInferenceTrace_conv_20min.csv"


def shape(arrivals: list[Arrival], minutes: int) -> tuple[float, float, int]:
    counts = per_minute(arrivals, minutes)
    return max(counts) / statistics.fmean(counts), sum(c == 0 for c in counts) / len(counts), sum(counts)


@pytest.mark.parametrize("trace", [CODE, CONV], ids=["code", "conv"])
@pytest.mark.parametrize("factor", [0.5, 3.0, 7.5])
def test_scale_rate_keeps_the_burst_shape(trace, factor):
    rows = window(load(trace), 0, 20)
    peak_mean, idle, total = shape(rows, 20)
    scaled = scale_rate(rows, factor, seed=1)
    s_peak_mean, s_idle, s_total = shape(scaled, 20)
    assert s_total == pytest.approx(total * factor, rel=0.05)
    assert s_peak_mean == pytest.approx(peak_mean, rel=0.15)
    assert s_idle == pytest.approx(idle, abs=0.05)
    assert all(a.at_s <= b.at_s for a, b in itertools.pairwise(scaled))


def test_the_azure_trace_loads_in_order_from_zero():
    rows = load(CODE)
    assert rows[0] == Arrival(0.0, 4808, 10)
    assert all(a.at_s <= b.at_s for a, b in itertools.pairwise(rows))
    cut = window(rows, 5, 10)
    assert cut and cut[0].at_s >= 0 and cut[-1].at_s < 10 * 60
    assert len(cut) < len(rows)


def test_mooncake_and_access_log_rows(tmp_path):
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text(
        '{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0]}\n'
        '{"timestamp": 1500, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
    )
    assert load(mooncake) == [BlockArrival(0.0, 6758, 500, (0,)), BlockArrival(1.5, 10, 5, (1,))]
    log = tmp_path / "access.log"
    line = {"model": "m", "e2e_ms": 500.0, "at": 1000.5, "measures": {"input_tokens": 12, "output_tokens": 3}}
    later = line | {"at": 1003.0, "e2e_ms": 0.0}
    log.write_bytes(b"INFO " + orjson.dumps(line) + b"\nnot json\n" + orjson.dumps(later) + b"\n")
    assert load(log) == [Arrival(0.0, 12, 3), Arrival(3.0, 12, 3)]
    with pytest.raises(ValueError, match="not an Azure CSV"):
        bad = tmp_path / "bad.txt"
        bad.write_text("hello\n")
        load(bad)


def test_mooncake_rows_of_one_tick_are_spread_over_it_and_keep_their_blocks(tmp_path):
    mooncake = tmp_path / "m.jsonl"
    rows = [(0, [0, 1, 2]), (0, [0, 1, 3]), (0, [4]), (3000, [0, 5]), (3000, [6])]
    mooncake.write_text(
        "".join(
            orjson.dumps({"timestamp": t, "input_length": 1500, "output_length": 10, "hash_ids": h}).decode() + "\n"
            for t, h in rows
        )
    )
    found = load(mooncake)
    assert [a.at_s for a in found] == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.5])  # 3 s ticks, spread
    assert [a.blocks for a in found] == [(0, 1, 2), (0, 1, 3), (4,), (0, 5), (6,)]  # file order kept
    cut = window(found, 0.05, None)  # from 3 s: re-timed, blocks kept
    assert [(a.at_s, a.blocks) for a in cut] == [(0.0, (0, 5)), (1.5, (6,))]


def test_replayed_prompts_share_text_where_the_trace_shares_blocks():
    from tidegate.cli.replay import prompt  # noqa: PLC0415

    a, b = prompt(0, 1500, (0, 1, 2)), prompt(1, 1500, (0, 1, 3))
    block = MOONCAKE_BLOCK_TOKENS * 4
    assert a[: 2 * block] == b[: 2 * block]  # blocks 0 and 1: the same text
    assert a[2 * block :] != b[2 * block :]
    assert len(a) == 1500 * 4 - 120  # the body the gateway estimates at the row's size
    assert prompt(2, 10).startswith("replayed row 2")  # an Azure row: as before


def test_a_replay_whose_sender_fell_behind_is_invalid():
    base = {"sent": True, "ok": True, "ttft_ms": 100.0, "at_s": 0.0, "input_tokens": 10, "reason": "baseline"}
    kept_up = summary([base | {"lag_ms": 1.0}] * 100, slo_ttft_ms=200, lag_p99_ms=50)
    behind = summary(
        [base | {"lag_ms": 1.0}] * 90 + [base | {"lag_ms": 500.0}] * 10, slo_ttft_ms=200, lag_p99_ms=50
    )
    assert kept_up["client_kept_up"] and kept_up["slo_attainment"] == 1.0
    assert not behind["client_kept_up"]
    slow = summary(
        [base | {"lag_ms": 1.0, "ttft_ms": 300.0, "reason": "saturated"}] * 4, slo_ttft_ms=200, lag_p99_ms=50
    )
    assert slow["slo_attainment"] == 0.0 and slow["spill_share"] == 1.0
