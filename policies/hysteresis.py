"""On/off thresholds with a minimum dwell time, so a spill decision does not flap.

Pure: the caller keeps the Latch and passes the time in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Latch:
    on: bool = False
    since: float = float("-inf")  # when `on` last changed (monotonic seconds)


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Turn on at `value >= on_at`, off at `value <= off_at` (`off_at <= on_at`); between them
    the latch keeps its state. No change within `dwell_s` of the last one."""

    on_at: float
    off_at: float
    dwell_s: float

    def step(self, latch: Latch, value: float | None, now: float) -> Latch:
        """The latch after seeing `value` at `now`; None (no evidence) counts as off."""
        if now - latch.since < self.dwell_s:
            return latch
        if not latch.on and value is not None and value >= self.on_at:
            return Latch(True, now)
        if latch.on and (value is None or value <= self.off_at):
            return Latch(False, now)
        return latch
