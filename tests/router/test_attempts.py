"""The walk over a decision's targets, as tables: events in, then where the cursor is, what
the reason says, and how a served request is described (router/request/walk.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from policies.base import Reason
from policies.types import EndpointKind
from router.record.records import Attempt, Outcome
from router.request.walk import Walk, tidegate_headers


@dataclass(frozen=True)
class T:
    name: str
    kind: EndpointKind = EndpointKind.SERVERLESS
    max_concurrency: int | None = None


DED, SL1, SL2 = T("ded", EndpointKind.DEDICATED, 2), T("sl1"), T("sl2")
BY_NAME = {t.name: t for t in (DED, SL1, SL2)}


def play(targets: tuple[T, ...], reason: Reason, events: list[str]) -> Walk[T]:
    """Events: `full` (the next dedicated target had no room), `go NAME` (an attempt starts
    at NAME, skipping the targets before it), `fail`, `ok`."""
    walk = Walk(targets, reason)
    for event in events:
        verb, _, name = event.partition(" ")
        if verb == "full":
            walk.saturated()
        elif verb == "go":
            skipped = next(s for s, t in walk.ahead() if t.name == name)
            walk.begin(BY_NAME[name], skipped)
        elif verb == "fail":
            walk.failed(Attempt(walk.last.name, "UpstreamUnreachable", 1.0))  # type: ignore[union-attr]
        elif verb == "ok":
            walk.ended(Attempt(walk.last.name, None, 1.0))  # type: ignore[union-attr]
    return walk


@pytest.mark.parametrize(
    ("targets", "events", "reason", "next_name", "fails_over", "served"),
    [
        ((DED, SL1), ["go ded", "ok"], Reason.BASELINE, "ded", False, Outcome.FIRST_TRY),
        ((DED, SL1), ["go ded", "fail"], Reason.BASELINE, "sl1", True, None),
        (
            (DED, SL1),
            ["go ded", "fail", "go sl1", "ok"],
            Reason.FAILOVER,
            "sl1",
            False,
            Outcome.FAILED_OVER_OK,
        ),
        ((DED, SL1), ["full", "go sl1", "ok"], Reason.SATURATED, "sl1", False, Outcome.FIRST_TRY),
        (
            (DED, SL1, SL2),
            ["full", "go sl1", "fail", "go sl2", "ok"],
            Reason.FAILOVER,
            "sl2",
            False,
            Outcome.FAILED_OVER_OK,
        ),
        ((SL1,), ["go sl1", "fail"], Reason.SERVERLESS_ONLY, "sl1", False, None),
        (
            (SL1,),
            ["go sl1", "fail", "go sl1", "ok"],
            Reason.SERVERLESS_ONLY,
            "sl1",
            False,
            Outcome.RETRIED_OK,
        ),
        ((SL1, SL2), ["go sl1", "fail", "go sl2", "fail"], Reason.FAILOVER, "sl1", True, None),  # wraps round
        # served where it first failed: a retry of that endpoint, though reached by failing over
        (
            (SL1, SL2),
            ["go sl1", "fail", "go sl2", "fail", "go sl1", "ok"],
            Reason.FAILOVER,
            "sl1",
            False,
            Outcome.RETRIED_OK,
        ),
    ],
)
def test_the_walk(targets, events, reason, next_name, fails_over, served):
    walk = play(targets, Reason.SERVERLESS_ONLY if targets[0] is not DED else Reason.BASELINE, events)
    assert walk.reason is reason
    assert walk.next.name == next_name
    assert walk.fails_over is fails_over
    if served is not None:
        assert walk.served_outcome() is served


def test_ahead_starts_at_the_cursor_and_goes_round_once():
    walk = play((DED, SL1, SL2), Reason.BASELINE, ["go sl1", "fail"])
    assert [(s, t.name) for s, t in walk.ahead()] == [(0, "sl2"), (1, "ded"), (2, "sl1")]


def test_a_cancelled_or_served_attempt_does_not_move_the_cursor():
    walk = play((DED, SL1), Reason.BASELINE, ["go ded", "ok"])
    assert walk.next is DED and len(walk.attempts) == 1


@pytest.mark.parametrize(
    ("events", "outcome", "overhead", "expected"),
    [
        (
            [],
            Outcome.EXHAUSTED,
            None,
            {"x-tidegate-reason": "baseline", "x-tidegate-attempts": "0", "x-tidegate-outcome": "exhausted"},
        ),
        (
            ["go ded"],
            None,
            None,
            {"x-tidegate-reason": "baseline", "x-tidegate-route": "ded", "x-tidegate-kind": "dedicated"},
        ),
        (
            ["go ded", "fail", "go sl1", "ok"],
            Outcome.FAILED_OVER_OK,
            0.25,
            {
                "x-tidegate-reason": "failover",
                "x-tidegate-route": "sl1",
                "x-tidegate-kind": "serverless",
                "x-tidegate-attempts": "2",
                "x-tidegate-outcome": "failed_over_ok",
                "x-tidegate-overhead-ms": "0.250",
            },
        ),
    ],
)
def test_every_tidegate_header_comes_from_one_place(events, outcome, overhead, expected):
    walk = play((DED, SL1), Reason.BASELINE, events)
    assert tidegate_headers(walk, outcome, overhead) == expected
