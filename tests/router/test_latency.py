"""Mergeable latency histograms: quantiles within the stated error, merging equals pooling."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.state.latency import RELATIVE_ACCURACY, SLICE_S, Histogram, LatencyBook, Metric, slices_in_window


def exact_quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


@pytest.mark.parametrize("q", [0.5, 0.95, 0.99])
def test_quantiles_are_within_the_relative_accuracy(q):
    rng = random.Random(7)
    values = [rng.lognormvariate(6.0, 1.2) for _ in range(20_000)]
    histogram = Histogram()
    for v in values:
        histogram.add(v)
    figures = histogram.figures()
    assert figures is not None
    got = {0.5: figures.p50, 0.95: figures.p95, 0.99: figures.p99}[q]
    # the rank is exact; the value reported for it is within the mapping's accuracy
    assert abs(got - exact_quantile(values, q)) <= 2 * RELATIVE_ACCURACY * exact_quantile(values, q)


@given(
    st.lists(st.floats(0.01, 1e6), min_size=1, max_size=200),
    st.lists(st.floats(0.01, 1e6), min_size=1, max_size=200),
)
def test_merging_two_histograms_equals_adding_every_value_to_one(a, b):
    left, right, pooled = Histogram(), Histogram(), Histogram()
    for v in a:
        left.add(v)
        pooled.add(v)
    for v in b:
        right.add(v)
        pooled.add(v)
    left.merge(right)
    assert left.counts == pooled.counts
    merged, expected = left.figures(), pooled.figures()
    assert merged is not None and expected is not None
    assert (merged.samples, merged.p50, merged.p95, merged.p99) == (
        expected.samples,
        expected.p50,
        expected.p95,
        expected.p99,
    )
    assert merged.mean == pytest.approx(expected.mean)


def test_mean_and_cv_come_from_exact_sums():
    histogram = Histogram()
    for v in (100.0, 200.0, 300.0):
        histogram.add(v)
    figures = histogram.figures()
    assert figures is not None
    assert figures.mean == pytest.approx(200.0)
    assert figures.cv == pytest.approx((20_000 / 3) ** 0.5 / 200.0)


def test_wire_fields_round_trip():
    histogram = Histogram()
    for v in (1.5, 15.0, 150.0, 150.0):
        histogram.add(v)
    fields = {str(k).encode(): str(c).encode() for k, c in histogram.counts.items()}
    fields[b"s"] = repr(histogram.total).encode()
    fields[b"q"] = repr(histogram.total_sq).encode()
    assert Histogram.from_fields(fields) == histogram


def test_an_empty_histogram_has_no_figures():
    assert Histogram().figures() is None


@pytest.mark.parametrize(
    ("wall", "window", "expected"),
    [
        (1005.0, 5, [1000]),
        (1005.0, 10, [990, 1000]),
        (1010.0, 10, [1000, 1010]),
        (1019.9, 60, [950, 960, 970, 980, 990, 1000, 1010]),
    ],
)
def test_a_window_spans_the_slices_it_overlaps(wall, window, expected):
    assert list(slices_in_window(wall, window)) == expected


def test_book_windows_merge_slices_and_forget_old_ones():
    book = LatencyBook()
    book.observe("m/a", Metric.TTFT, 100.0, 1000.0)
    book.observe("m/a", Metric.TTFT, 300.0, 1000.0 + SLICE_S)
    book.observe("m/a", Metric.E2E, 900.0, 1000.0)
    later = 1000.0 + SLICE_S + 5
    assert book.window("m/a", Metric.TTFT, later, 10).samples == 2
    assert book.window("m/a", Metric.TTFT, later, 5).samples == 1
    book.forget_before(1000.0 + SLICE_S)
    assert book.window("m/a", Metric.TTFT, later, 10).samples == 1
