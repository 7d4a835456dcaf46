"""What happened to each request: one structured log line and in-process aggregates.

Times are milliseconds. The aggregates are per route (model, endpoint) and live in this
process only; the shared, windowed histograms come with the state store.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import orjson

ACCESS_LOG = "tidegate.access"


class Outcome(StrEnum):
    """How a request's attempts ended."""

    FIRST_TRY = "first_try"  # the first attempt served it
    RETRIED_OK = "retried_ok"  # served by a later attempt at the same endpoint
    FAILED_OVER_OK = "failed_over_ok"  # served by another endpoint after a failure
    HEDGED_OK = "hedged_ok"  # a slow first token was hedged: served by whichever answered first
    EXHAUSTED = "exhausted"  # every attempt allowed (by count, budget or time) failed
    CLIENT_ERROR = "client_error"  # the upstream rejected the request itself (4xx): not retried
    CLIENT_GONE = "client_gone"  # the client left before the answer was complete
    FAILED_MID_STREAM = "failed_mid_stream"  # the upstream failed after the first byte
    INTERNAL_ERROR = "internal_error"  # the gateway itself failed (a bug): logged, answered 500


@dataclass(frozen=True, slots=True)
class Attempt:
    endpoint: str
    error: str | None  # None: this attempt served the request
    duration_ms: float
    detail: str | None = None  # for the operator: what the transport said (never sent to clients)


@dataclass(frozen=True, slots=True)
class Hedge:
    """A request whose slow first attempt was hedged (router/request/hedge.py): the kind of endpoint
    that won, and the attempt that lost (cancelled, or failed) with the prompt tokens sent to
    it for nothing."""

    winner: str  # "dedicated" or "serverless"
    loser: str  # the losing endpoint's name
    duplicate_tokens_in: int


@dataclass(frozen=True, slots=True)
class Measures:
    """What was measured of a request's answer (milliseconds, tokens)."""

    ttft_ms: float | None = None  # request received -> first output relayed (streams only)
    input_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = None  # None: served in full
    tokens_estimated: bool = False  # the upstream sent no usage; output counted from events
    queue_ms: float = 0.0  # waited in line for a dedicated slot
    itl_ms: float | None = None  # mean gap between output events (streams with 2+ events)
    output_tokens_per_s: float | None = None  # output tokens / (last event - first event)
    failed_check: str | None = None  # the automatic success check a served answer failed
    code: str | None = None  # the error's OpenAI `code` the client read (upstream_stream_cut, ...)
    cut_by_caller: bool = False  # ended `length` under the client's own token limit (record/success.py)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    model: str
    route: str | None  # the endpoint that answered last; None if none was tried
    kind: str | None
    reason: str
    status: int
    stream: bool
    e2e_ms: float
    measures: Measures
    outcome: Outcome
    attempts: tuple[Attempt, ...] = field(default=())
    retry_budget_denied: bool = False  # a retry was wanted but the model's budget was spent
    stickiness_bucket: float | None = None  # the key's canary bucket in [0, 100)
    overhead_ms: float | None = None  # time spent in the gateway itself (see dispatch.py)
    request_id: str | None = None  # x-tidegate-request-id, the key for POST /v1/feedback
    task_id: str | None = None  # the client's x-tidegate-task-id, when it sent one
    success: bool | None = None  # served, complete, passing the automatic checks (record/success.py)
    cost_usd: float = 0.0  # serverless: its tokens at the endpoint's prices (dedicated: priced by time)
    at: float | None = None  # wall-clock time it was recorded (Unix s): the access log replays as a trace
    hedge: Hedge | None = None  # its slow first attempt was hedged
    caller: str | None = None  # who sent it: its key's name (router/http/auth.py), never the key
    placement: str | None = None  # why that dedicated replica (policies/placement.py); None: no choice


@dataclass(slots=True)
class RouteTotals:
    requests: int = 0
    errors: int = 0
    output_tokens: int = 0
    ttft_ms: deque[float] = field(default_factory=lambda: deque(maxlen=1024))
    e2e_ms: deque[float] = field(default_factory=lambda: deque(maxlen=1024))


class OutcomeSink(Protocol):
    def record(self, record: RequestRecord) -> None: ...


class Recorder:
    """Logs every outcome and keeps recent per-route figures. Not thread-safe (one loop)."""

    def __init__(self, logger: logging.Logger | None = None, sinks: Sequence[OutcomeSink] = ()) -> None:
        """`sinks` also get every outcome (the app passes its Telemetry)."""
        self._log = logger or logging.getLogger(ACCESS_LOG)
        self._sinks = tuple(sinks)
        self.routes: dict[tuple[str, str], RouteTotals] = {}
        self.reasons: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()

    def record(self, record: RequestRecord) -> None:
        for sink in self._sinks:
            sink.record(record)
        self.reasons[record.reason] += 1
        self.outcomes[record.outcome] += 1
        totals = self.routes.setdefault((record.model, record.route or "-"), RouteTotals())
        totals.requests += 1
        m = record.measures
        totals.errors += record.status >= 400 or m.error is not None
        totals.output_tokens += m.output_tokens or 0
        if m.ttft_ms is not None:
            totals.ttft_ms.append(m.ttft_ms)
        totals.e2e_ms.append(record.e2e_ms)
        if self._log.isEnabledFor(logging.INFO):
            self._log.info(orjson.dumps(record).decode())  # orjson walks dataclasses natively
