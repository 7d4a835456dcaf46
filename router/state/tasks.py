"""Tasks as the stores keep them: the state before a change, what a settle says, and what a
feedback found. The ledger that moves the counters is router/record/tasks.py."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class TaskState:
    """A task as the store held it before a change: `route` empty when nothing settled it yet
    (`failed` then says whether its owner's early failure feedback was waiting for it)."""

    route: str = ""
    ok: bool = False
    failed: bool = False
    owner: str = ""
    # a settle only: a request of the task that arrived later settled first, so the task stays on
    # `route` with `ok` (this settle moved nothing but, with early feedback, `failed`)
    superseded: bool = False
    started_ms: int = 0  # when the request the task is on arrived (Unix ms)


class FeedbackResult(StrEnum):
    APPLIED = "applied"  # the task was settled: its counters moved (or had nothing to move)
    KEPT = "kept"  # not settled yet: kept, and applied when it is
    IGNORED = "ignored"  # success feedback on a task not settled yet: nothing to keep
    NOT_OWNER = "not_owner"  # the task belongs to another key
    TOO_EARLY = "too_many_early"  # the caller's bound of kept early feedback is full


@dataclass(frozen=True, slots=True)
class EarlyBound:
    """How much failure feedback on tasks not settled yet a store keeps, per caller."""

    max_per_caller: int = 100
    keep_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Feedback:
    task: str  # the task's name in the store
    before: TaskState
    result: FeedbackResult


@dataclass(frozen=True, slots=True)
class Settlement:
    task: str  # the store's name (task_name)
    request: str
    route: str
    ok: bool
    owner: str
    # when the request arrived (Unix ms, the gateway replica's clock): a task is on the route of
    # its request that arrived last, whatever order the replicas' settles come in (0: unknown).
    # Arrival, not the end: a step starts only after the client read the step before it, while
    # a gateway replica may write its books after the next step has ended on another one
    started_ms: int = 0
