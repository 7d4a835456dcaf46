"""A canary run: its state machine (`idle -> progressing -> promoted`, or `paused`, or
`rolled_back`), the step an analysis leads to, and what an admin action does to it. Pure
functions of the run, the analysis and the config: the controller (router/canary/controller.py)
persists what they return."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import orjson

from router.canary.analysis import Analysis, Verdict
from router.config import CanaryControllerConfig
from router.errors import ClientError

IDLE, PROGRESSING, PAUSED, PROMOTED, ROLLED_BACK = "idle", "progressing", "paused", "promoted", "rolled_back"
ACTIONS = ("start", "pause", "resume", "abort", "promote")  # an admin's
DECISIONS = ("step_up", "hold", "hold_failed", "rollback", "pause", "promote")  # the controller's (decide)


class CanaryConflict(ClientError):
    status = 409
    code = "canary_conflict"


@dataclass(frozen=True, slots=True)
class CanaryRun:
    state: str = IDLE
    step: int = -1  # index into the model's plan of percents
    percent: float = 0.0
    failures: int = 0  # failed analyses in a row
    next_at: float | None = None  # wall-clock time of the next analysis
    started_at: float | None = None
    updated_at: float | None = None
    note: str = ""

    def as_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def parse(cls, raw: bytes | None) -> CanaryRun:
        if not raw:
            return cls()
        found = orjson.loads(raw)
        return cls(**{k: v for k, v in found.items() if k in cls.__dataclass_fields__})


def started(canary: CanaryControllerConfig, now: float) -> CanaryRun:
    plan = canary.plan()
    return CanaryRun(PROGRESSING, 0, plan[0], 0, now + canary.interval_s, now, now, "started")


def decide(
    run: CanaryRun, analysis: Analysis, canary: CanaryControllerConfig, now: float
) -> tuple[CanaryRun, str]:
    """The next run after an analysis, and the action's name."""
    plan = canary.plan()
    later = now + canary.interval_s
    if analysis.verdict is Verdict.PASS:
        step = run.step + 1
        if step >= len(plan) - 1:
            return replace(
                run,
                state=PROMOTED,
                step=len(plan) - 1,
                percent=plan[-1],
                failures=0,
                next_at=None,
                updated_at=now,
                note="promoted",
            ), "promote"
        return replace(
            run,
            step=step,
            percent=plan[step],
            failures=0,
            next_at=later,
            updated_at=now,
            note=f"step {step + 1} of {len(plan)}",
        ), "step_up"
    if analysis.verdict is Verdict.INCONCLUSIVE:
        return replace(run, next_at=later, updated_at=now, note=analysis.reason), "hold"
    failures = run.failures + 1
    if failures < canary.failure_threshold:
        return replace(
            run, failures=failures, next_at=later, updated_at=now, note=analysis.reason
        ), "hold_failed"
    if canary.on_failure == "rollback":
        note = f"rolled back after {failures} failed analyses: {analysis.reason}"
        return replace(
            run, state=ROLLED_BACK, percent=0.0, failures=failures, next_at=None, updated_at=now, note=note
        ), "rollback"
    note = f"paused after {failures} failed analyses: {analysis.reason}"
    return replace(run, state=PAUSED, failures=failures, next_at=None, updated_at=now, note=note), "pause"


def admin_action(run: CanaryRun, action: str, canary: CanaryControllerConfig, now: float) -> CanaryRun:
    plan = canary.plan()
    if action == "start":
        if run.state == PROGRESSING:
            raise CanaryConflict("a canary run is already in progress; pause or abort it first")
        return started(canary, now)
    if action == "pause":
        if run.state != PROGRESSING:
            raise CanaryConflict(f"only a run in progress can be paused (state: {run.state})")
        return replace(run, state=PAUSED, next_at=None, updated_at=now, note="paused by an admin")
    if action == "resume":
        if run.state != PAUSED or run.step < 0:
            raise CanaryConflict(f"only a paused run can be resumed (state: {run.state})")
        percent = plan[min(run.step, len(plan) - 1)]
        return replace(
            run,
            state=PROGRESSING,
            percent=percent,
            failures=0,
            next_at=now + canary.interval_s,
            updated_at=now,
            note="resumed",
        )
    if action == "abort":
        return replace(
            run, state=ROLLED_BACK, percent=0.0, next_at=None, updated_at=now, note="aborted by an admin"
        )
    if action == "promote":
        return replace(
            run,
            state=PROMOTED,
            step=len(plan) - 1,
            percent=plan[-1],
            next_at=None,
            updated_at=now,
            note="promoted by an admin",
        )
    raise CanaryConflict(f"unknown canary action {action!r}; one of {', '.join(ACTIONS)}")
