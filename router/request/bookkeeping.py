"""What the gateway writes down about a finished request: the route's shared histograms and
counters in the store (buffered, no I/O), the access-log outcome (and through the recorder's
sinks, the Prometheus metrics), and the end of its spans."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

from policies.canary import bucket
from policies.types import route_key
from router.config import DedicatedEndpoint, Endpoint, ServerlessEndpoint
from router.economics.cost import token_cost_usd
from router.economics.teams import team_fields
from router.record.callers import caller_fields
from router.record.records import Hedge, Measures, Outcome, Recorder, RequestRecord
from router.record.success import AnswerShape, cut_by_caller, judge
from router.record.tasks import TaskLedger
from router.request.job import Job, ms_since
from router.request.quota import Quota
from router.request.relay import StreamResult, Usage, parsed_body, usage_of
from router.request.spans import end_spans
from router.state.latency import Metric


class Samples(Protocol):
    """The state store as the books use it: no I/O, merged into the shared windows later."""

    def observe(self, route: str, metric: Metric, value_ms: float) -> None: ...

    def count(self, route: str, counts: Mapping[str, float]) -> None: ...


class Mirror(Protocol):
    """Where a mirrored request's answered twin goes (router/spill/shadow.py): it must not block."""

    def offer(self, job: Job, live: Endpoint, shape: AnswerShape) -> None: ...


class Books:
    def __init__(
        self,
        store: Samples,
        recorder: Recorder,
        *,
        recording: bool = True,
        ledger: TaskLedger | None = None,
        mirror: Mirror | None = None,
        quota: Quota | None = None,
    ) -> None:
        """`recording=False` keeps the log, metrics and spans but not the store's per-route
        histograms and counters (`state.record`), nor tasks. `ledger` settles each request
        into its task (router/record/tasks.py); `mirror` gets each answered request the
        model's shadow samples, once its answer is recorded."""
        self._store = store
        self._recorder = recorder
        self._recording = recording
        self._ledger = ledger
        self._mirror = mirror
        self._quota = quota  # settles a named key's tokens and spend once the answer is known

    def observe(self, route: str, metric: Metric, value_ms: float) -> None:
        if self._recording:
            self._store.observe(route, metric, value_ms)

    def body_done(self, job: Job, target: Endpoint, status: int, body: bytes) -> None:
        """A served body answer (error answers are recorded by the dispatcher's failure path)."""
        parsed = parsed_body(body)
        usage = usage_of(parsed) or Usage()
        shape = AnswerShape()
        if isinstance(parsed, dict):
            shape.take_choices(
                parsed.get("choices"), job.facts.config.success.max_checked_bytes, collect=True
            )
        cut = cut_by_caller(shape, job.facts.request)
        self._observe_e2e(route_key(job.facts.request.model, target.name), usage.output_tokens, job, cut=cut)
        failed_check = judge(shape, job.facts.config.success, job.facts.request)
        tokens_in, tokens_out = usage.input_tokens, usage.output_tokens
        measures = Measures(
            None, tokens_in, tokens_out, queue_ms=job.queue_ms, failed_check=failed_check, cut_by_caller=cut
        )
        self.record(job, target, status, measures, job.walk.served_outcome())
        if self._mirror is not None and job.facts.mirrored and status < 400:
            self._mirror.offer(job, target, shape)

    def stream_done(self, job: Job, target: Endpoint, status: int, result: StreamResult) -> None:
        usage = result.usage or Usage()
        error = None
        if result.error is not None:
            error = type(result.error).__name__
        elif result.cut is not None:
            error = result.cut
        elif not result.completed:
            error = "client_gone"
        failed_check = None
        if error is None:
            failed_check = judge(result.shape, job.facts.config.success, job.facts.request)
        ttft = (result.first_token_at - job.facts.received_at) * 1000 if result.first_token_at else None
        estimated = usage.output_tokens is None
        output = result.output_events if estimated else usage.output_tokens
        cut = cut_by_caller(result.shape, job.facts.request)
        itl = self._observe_stream(job, target, result, served=error is None, output=output, cut=cut)
        rate = None
        if itl and output and result.output_events > 1:  # tokens over the span of the output events
            rate = round(output / (itl * (result.output_events - 1) / 1000.0), 2)
        code = result.error.code if result.error is not None else None
        measures = Measures(
            ttft,
            usage.input_tokens,
            output,
            error,
            estimated,
            job.queue_ms,
            itl,
            rate,
            failed_check,
            code,
            cut,
        )
        if result.error is not None:
            outcome = Outcome.FAILED_MID_STREAM
        elif error is not None:
            outcome = Outcome.CLIENT_GONE
        else:
            outcome = job.walk.served_outcome()
        self.record(job, target, status, measures, outcome)
        if self._mirror is not None and job.facts.mirrored and error is None and status < 400:
            self._mirror.offer(job, target, result.shape)

    def _observe_stream(
        self, job: Job, target: Endpoint, result: StreamResult, *, served: bool, output: int | None, cut: bool
    ) -> float | None:
        """The route's own latency: from this attempt's request, not from the client's (a
        failover's earlier attempts and the wait in line are not the route's doing). `output`:
        the answer's tokens (usage, else events); `cut`: its length was the caller's choice.
        Returns the stream's mean inter-token latency (ms) when it had 2+ output events."""
        route = route_key(job.facts.request.model, target.name)
        itl = None
        if result.first_token_at:
            self.observe(route, Metric.TTFT, (result.first_token_at - job.attempt_started) * 1000)
            if result.output_events > 1:
                itl = (time.monotonic() - result.first_token_at) * 1000 / (result.output_events - 1)
                self.observe(route, Metric.ITL, itl)
        if served:
            self._observe_e2e(route, output, job, cut=cut)
        return itl

    def _observe_e2e(self, route: str, output_tokens: int | None, job: Job, *, cut: bool) -> None:
        """A served answer's end-to-end latency, and per output token when it had any and its
        length was not the caller's choice (`cut`: a caller could steer the canary's figure by
        cutting its answers on one side, as with its rates; router/canary/weights.py)."""
        e2e_ms = ms_since(job.attempt_started)
        self.observe(route, Metric.E2E, e2e_ms)
        if output_tokens and not cut:
            self.observe(route, Metric.E2E_PER_TOKEN, e2e_ms / output_tokens)

    def record(
        self, job: Job, target: Endpoint | None, status: int, measures: Measures, outcome: Outcome
    ) -> None:
        ok = status < 400 and measures.error is None and measures.failed_check is None
        cost = _token_cost(target, measures)
        key = job.facts.client.key
        if key is not None and self._quota is not None:
            self._quota.count(key, ok=ok, usd=cost)
        if job.grant is not None and self._quota is not None:
            self._quota.settle_later(job.grant, _used_tokens(job, status, measures), cost)
        if self._recording:
            self._count(job, target, status, measures, outcome, ok=ok, cost=cost)
            if target is not None and status < 400:  # the traffic shape's token distributions
                route = route_key(job.facts.request.model, target.name)
                if measures.input_tokens:
                    self._store.observe(route, Metric.TOKENS_IN, measures.input_tokens)
                if measures.output_tokens:
                    self._store.observe(route, Metric.TOKENS_OUT, measures.output_tokens)
            if self._ledger is not None:
                route = route_key(job.facts.request.model, target.name if target else "-")
                facts = job.facts
                started_s = time.time() - ms_since(facts.received_at) / 1000  # its arrival, wall clock
                self._ledger.settle_later(
                    facts.task_id, facts.request_id, route, ok, facts.client.caller, started_s=started_s
                )
        if job.span is not None:
            end_spans(job, target, status, measures, outcome)
        self._recorder.record(
            RequestRecord(
                model=job.facts.request.model,
                route=target.name if target else None,
                kind=target.kind if target else None,
                reason=job.walk.reason,
                status=status,
                stream=job.facts.request.stream,
                e2e_ms=ms_since(job.facts.received_at),
                measures=measures,
                outcome=outcome,
                attempts=tuple(job.walk.attempts),
                retry_budget_denied=job.budget_denied,
                stickiness_bucket=bucket(job.facts.request.model, job.facts.stickiness_key),
                overhead_ms=job.overhead_ms,
                request_id=job.facts.request_id,
                task_id=job.facts.task_id if job.facts.task_id != job.facts.request_id else None,
                success=ok,
                cost_usd=cost,
                at=time.time(),
                hedge=job.hedge,
                caller=job.facts.client.caller,
                placement=job.walk.placed,
            )
        )

    def _count(
        self,
        job: Job,
        target: Endpoint | None,
        status: int,
        measures: Measures,
        outcome: Outcome,
        *,
        ok: bool,
        cost: float,
    ) -> None:
        """The request in its final route's shared counters (`-` when no route was tried):
        its outcome, tokens, success or the check it failed, what it cost (serverless: its
        tokens at the endpoint's prices; dedicated: slot time, priced by the hour in the
        report) and what of that was wasted on a failure. Failed attempts before it that held
        a dedicated slot count their slot time, all of it wasted, on their own routes."""
        counts: dict[str, float] = {
            "requests": 1,
            f"outcome:{outcome.value}": 1,
            f"reason:{job.walk.reason.value}": 1,
        }
        if ok:
            counts["ok"] = 1
        else:
            counts[f"fail:{_failure_name(status, measures)}"] = 1
        if status >= 400 or measures.error is not None:
            counts["errors"] = 1
        if job.walk.retries:
            counts["retries"] = job.walk.retries
        counts.update(_token_counts(measures))
        if cost:
            counts["cost_usd"] = cost
            if not ok:
                counts["wasted_usd"] = cost
        if target is not None and job.attempt_started:
            busy = ms_since(job.attempt_started)  # in flight (dedicated: slot held) until now
            counts["busy_ms"] = busy
            if not ok and isinstance(target, DedicatedEndpoint):
                counts["wasted_busy_ms"] = busy
        counts.update(_tenant_counts(job, target, measures, counts.get("busy_ms", 0.0), ok=ok, cost=cost))
        if _route_answers_for(job, outcome, measures):
            counts.update(caller_fields(job.facts.client.caller, ok=ok, error="errors" in counts))
        else:
            counts["not_the_routes"] = 1
        model = job.facts.request.model
        self._store.count(route_key(model, target.name if target else "-"), counts)
        self._count_failed_attempts(job, target)
        if job.hedge is not None:
            self._count_hedge(job, job.hedge)

    def _count_hedge(self, job: Job, hedge: Hedge) -> None:
        """On the winner's route `hedge_won`; on the loser's `hedge_lost`, the prompt tokens it
        was sent for nothing and, serverless, what they cost (spend, never a request). A
        dedicated loser's slot time is counted with the failed attempts, as wasted."""
        model = job.facts.request.model
        if job.walk.last is not None:
            self._store.count(route_key(model, job.walk.last.name), {"hedge_won": 1})
        loser = next((e for e in job.facts.config.endpoints if e.name == hedge.loser), None)
        counts = {"hedge_lost": 1.0, "hedge_tokens_in": float(hedge.duplicate_tokens_in)}
        if isinstance(loser, ServerlessEndpoint):
            counts["hedge_usd"] = token_cost_usd(
                hedge.duplicate_tokens_in, 0, loser.usd_per_mtok_in, loser.usd_per_mtok_out
            )
        self._store.count(route_key(model, hedge.loser), counts)

    def _count_failed_attempts(self, job: Job, target: Endpoint | None) -> None:
        attempts = job.walk.attempts
        failed = (
            attempts[:-1]
            if target is not None and attempts and attempts[-1].endpoint == target.name
            else attempts
        )
        if not failed:
            return
        dedicated = {e.name for e in job.facts.config.dedicated}
        for attempt in failed:
            if attempt.endpoint in dedicated and attempt.error is not None:
                busy = attempt.duration_ms
                route = route_key(job.facts.request.model, attempt.endpoint)
                counts = {"busy_ms": busy, "wasted_busy_ms": busy, "failed_attempts": 1}
                counts.update(caller_fields(job.facts.client.caller, ok=False, error=True))
                self._store.count(route, counts)


def _tenant_counts(
    job: Job, target: Endpoint | None, measures: Measures, busy_ms: float, *, ok: bool, cost: float
) -> dict[str, float]:
    """A named key's team counters and a batch request's share of its route."""
    counts: dict[str, float] = {}
    if job.facts.batch_wait_s is not None:
        counts.update(_batch_counts(job, target, measures, busy_ms))
    key = job.facts.client.key
    if key is not None:  # its team's requests, successes, spend and slot time
        counts.update(team_fields(key.team, ok=ok, usd=cost, busy_ms=busy_ms))
    return counts


def _batch_counts(job: Job, target: Endpoint | None, measures: Measures, busy_ms: float) -> dict[str, float]:
    """A batch request's share of its route: its slot time, and on a dedicated pool what the
    model's first serverless endpoint would have charged for its answer (the spill it did not
    make; a served answer, whether or not it passed the success checks)."""
    counts = {"batch": 1.0, "batch_busy_ms": busy_ms}
    serverless = job.facts.config.serverless
    if measures.error is None and isinstance(target, DedicatedEndpoint) and serverless:
        price = serverless[0]
        tokens_in, tokens_out = measures.input_tokens or 0, measures.output_tokens or 0
        counts["batch_avoided_usd"] = token_cost_usd(
            tokens_in, tokens_out, price.usd_per_mtok_in, price.usd_per_mtok_out
        )
    return counts


def _token_counts(measures: Measures) -> dict[str, float]:
    counts: dict[str, float] = {}
    if measures.input_tokens:
        counts["tokens_in"] = measures.input_tokens
    if measures.output_tokens:
        counts["tokens_out"] = measures.output_tokens
    if measures.tokens_estimated:
        counts["tokens_estimated"] = 1
    return counts


def _route_answers_for(job: Job, outcome: Outcome, measures: Measures) -> bool:
    """Whether the request's outcome is its route's doing, as the canary compares routes: an
    upstream 4xx for the request itself, a client that left, and an answer cut by the
    client's own token limit are the caller's (router/canary/weights.py)."""
    if outcome in (Outcome.CLIENT_ERROR, Outcome.CLIENT_GONE):
        return False
    return not measures.cut_by_caller


def _token_cost(target: Endpoint | None, measures: Measures) -> float:
    """A serverless answer's price: its tokens (reported, or estimated) at the endpoint's prices."""
    if not isinstance(target, ServerlessEndpoint):
        return 0.0
    return token_cost_usd(
        measures.input_tokens or 0,
        measures.output_tokens or 0,
        target.usd_per_mtok_in,
        target.usd_per_mtok_out,
    )


def _failure_name(status: int, measures: Measures) -> str:
    """The counter name of why a request did not succeed: its error, or its status."""
    if measures.error is not None:
        return measures.error
    return measures.failed_check if measures.failed_check is not None else f"http_{status}"


def _used_tokens(job: Job, status: int, measures: Measures) -> int:
    """What a request's key is charged in tokens: its usage when known; nothing for a request
    that failed without an answer; else (an answer without usage) what it reserved."""
    if measures.input_tokens is not None or measures.output_tokens is not None:
        return (measures.input_tokens or 0) + (measures.output_tokens or 0)
    if status >= 400:
        return 0
    assert job.grant is not None
    return job.grant.ask.tokens
