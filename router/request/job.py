"""One request while it is dispatched: the facts fixed when it arrived, its walk over the
targets (router/request/walk.py), and what its attempts measured so far."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry.trace import Span

from policies.types import Snapshot
from router.config import Endpoint, KeyConfig, ModelConfig
from router.openai import RequestPeek
from router.record.records import Hedge
from router.request.walk import Walk

if TYPE_CHECKING:
    from router.request.quota import Grant


@dataclass(frozen=True, slots=True)
class Client:
    """Who sent a request: the socket's address (or, behind a trusted proxy, the one it
    forwarded) and the caller's name (its key's, router/http/auth.py), which owns its task."""

    ip: str | None = None
    caller: str = "anonymous"
    key: KeyConfig | None = None  # a named key's tenant entry: its limits, budgets and priority


NO_CLIENT = Client()  # tests and benchmarks that call the dispatcher directly


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """What is known of a request when it arrives; nothing changes it while it is served.
    Times are monotonic seconds, except `deadline` (event-loop time). Built by name only: 16
    fields in a row are too easy to swap."""

    path: str
    request: RequestPeek
    config: ModelConfig
    headers: Sequence[tuple[bytes, bytes]]
    received_at: float
    snapshot: Snapshot  # what the policy decided on
    stickiness_key: str
    client: Client
    deadline: float  # by which the whole request ends (limits.request_timeout_s)
    queue_ms: float  # how long the policy lets the first dedicated target keep it in line
    request_id: str  # x-tidegate-request-id
    task_id: str  # the client's x-tidegate-task-id, else request_id (a task of its own)
    admit_within: Mapping[str, int]  # pool -> most pending prompt tokens (predicted-TTFT admission)
    prompt_tokens: int  # counted as pending prefill on a dedicated pool (0: not counted)
    mirrored: bool = False  # sent to the model's shadow endpoint once answered (router/request/mirror.py)
    batch_wait_s: float | None = None  # a batch request: how long it may wait for a slot (priority.py)
    prefix_blocks: tuple[int, ...] = ()  # its prompt's prefix hashes (router/request/placement.py)


@dataclass(slots=True)
class Job:
    """A request's facts, its walk, and the progress of its attempts (milliseconds `*_ms`,
    monotonic seconds `attempt_started`)."""

    facts: Facts
    walk: Walk[Endpoint]
    span: Span | None = None  # the request's span (None: tracing off)
    attempt_span: Span | None = None
    attempt_started: float = 0.0  # the current attempt's request was sent after this
    queue_ms: float = 0.0  # time spent waiting in line for a dedicated slot
    backoff_ms: float = 0.0  # slept between attempts (not the gateway's overhead)
    budget_denied: bool = False  # a retry was wanted and the model's budget said no
    overhead_ms: float | None = None
    sent: asyncio.Event | None = None  # set when an attempt's request goes out (hedged models only)
    deferred_ms: float = 0.0  # a hedge attempt's: how long after arrival it started
    hedge: Hedge | None = None  # the request hedged: who won, what the loser cost
    grant: Grant | None = None  # what it took from its key's limits (router/request/quota.py)

    def hedge_to(self, walk: Walk[Endpoint]) -> Job:
        """The hedge attempt's own job: the same facts (and body), its own walk and timings."""
        started = ms_since(self.facts.received_at)
        return Job(self.facts, walk, span=self.span, deferred_ms=started)


def ms_since(since: float) -> float:
    return (time.monotonic() - since) * 1000.0


def overhead_ms(job: Job) -> float:
    """Time the gateway itself spent before the answer started: since the request arrived,
    minus the wait in line, backoff sleeps and the time each upstream attempt took (the
    current one up to its headers or first event)."""
    upstream = sum(a.duration_ms for a in job.walk.attempts)
    waited = job.queue_ms + job.backoff_ms + job.deferred_ms
    return max(0.0, ms_since(job.facts.received_at) - waited - upstream)
