"""The report's money columns print at one precision per column."""

from __future__ import annotations

import pytest

from router.cli.report import usd_column


@pytest.mark.parametrize(
    ("values", "shown"),
    [
        ([4.42, 0.384198, 0.0], ["4.420", "0.384", "0.000"]),
        ([1234.5, 2.0], ["1,234.50", "2.00"]),
        ([0.000123, 0.5, None], ["0.000123", "0.500000", "-"]),
        ([0.0, 0.0], ["0.00", "0.00"]),
        ([0.0000001, 3.0], ["0.000000", "3.000000"]),  # at most 6 decimals
    ],
)
def test_a_column_of_dollars_has_one_precision(values, shown):
    assert usd_column(values) == shown
    decimals = {len(s.split(".")[1]) for s in shown if s != "-"}
    assert len(decimals) == 1
