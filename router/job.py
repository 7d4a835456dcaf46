"""One request while it is dispatched: the mutable record the dispatcher and the
bookkeeping share, and the small facts derived from it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from opentelemetry.trace import Span

from policies.base import Decision, Reason
from policies.types import Snapshot
from router.config import Endpoint, ModelConfig
from router.openai import RequestPeek
from router.records import Attempt, RetryOutcome


@dataclass(slots=True)
class Job:
    """The mutable record of one request while it is dispatched. Times are monotonic
    seconds (`*_at`, `*_started`) or milliseconds (`*_ms`)."""

    path: str
    request: RequestPeek
    config: ModelConfig
    headers: Sequence[tuple[bytes, bytes]]
    received_at: float
    decision: Decision[Endpoint]
    reason: Reason
    snapshot: Snapshot
    cursor: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    last_target: Endpoint | None = None
    stickiness_key: str = ""
    span: Span | None = None  # the request's span (None: tracing off)
    attempt_span: Span | None = None
    overhead_ms: float | None = None
    backoff_ms: float = 0.0  # slept between attempts (not the gateway's overhead)
    budget_denied: bool = False
    attempt_started: float = 0.0  # the current attempt's request was sent after this
    queue_ms: float = 0.0  # time spent waiting in line for a dedicated slot
    client_ip: str | None = None
    deadline: float = float("inf")  # event-loop time by which the whole request ends
    bodies: dict[str, bytes] = field(default_factory=dict)  # upstream model id -> encoded body


def ms_since(since: float) -> float:
    return (time.monotonic() - since) * 1000.0


def served_outcome(job: Job, target: Endpoint) -> RetryOutcome:
    """How a served request's attempts went: first try, a retry at the same endpoint, or a
    failover to another one."""
    if len(job.attempts) <= 1:
        return RetryOutcome.FIRST_TRY
    if job.attempts[0].endpoint == target.name:
        return RetryOutcome.RETRIED_OK
    return RetryOutcome.FAILED_OVER_OK


def overhead_ms(job: Job) -> float:
    """Time the gateway itself spent before the answer started: since the request arrived,
    minus the wait in line, backoff sleeps and the time each upstream attempt took (the
    current one up to its headers or first event)."""
    upstream = sum(a.duration_ms for a in job.attempts)
    return max(0.0, ms_since(job.received_at) - job.queue_ms - job.backoff_ms - upstream)
