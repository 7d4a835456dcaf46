"""Traces for `tidegate replay`: the three formats load, a window cuts, and --scale-rate keeps
the burst shape (peak/mean per minute, the share of idle minutes) on the real Azure traces."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import orjson
import pytest

from router.offline.replay import Arrival, load, per_minute, scale_rate, summary, window

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
    assert load(mooncake) == [Arrival(0.0, 6758, 500), Arrival(1.5, 10, 5)]
    log = tmp_path / "access.log"
    line = {"model": "m", "e2e_ms": 500.0, "at": 1000.5, "measures": {"input_tokens": 12, "output_tokens": 3}}
    later = line | {"at": 1003.0, "e2e_ms": 0.0}
    log.write_bytes(b"INFO " + orjson.dumps(line) + b"\nnot json\n" + orjson.dumps(later) + b"\n")
    assert load(log) == [Arrival(0.0, 12, 3), Arrival(3.0, 12, 3)]
    with pytest.raises(ValueError, match="not an Azure CSV"):
        bad = tmp_path / "bad.txt"
        bad.write_text("hello\n")
        load(bad)


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
