"""One request's life: snapshot -> policy -> admission -> attempts -> relay -> record.

All I/O of a request is started here. Attempts are driven by tenacity: an attempt that fails
before the first byte reached the client moves on to the next target of the decision
(dedicated -> serverless -> next serverless), without waiting when the next target is a
different endpoint, with backoff (or the upstream's Retry-After) when it is the same one.
What is written down about a finished request is router/request/bookkeeping.py's job.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, stop_after_attempt

from policies.base import Policy, Reason, RequestContext
from policies.types import route_key
from router.config import DedicatedEndpoint, GatewayConfig, ServerlessEndpoint
from router.errors import (
    INTERNAL_ERROR_MESSAGE,
    REQUEST_TIMEOUT_MESSAGE,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NoCapacity,
    RequestTimeout,
    UpstreamFailure,
    UpstreamStatus,
)
from router.fleet.membership import Fleet
from router.openai import PATHS, RequestPeek, peek
from router.record.records import Attempt, Hedge, Measures, Outcome
from router.record.tasks import valid_task_id
from router.record.telemetry import Telemetry
from router.request.asks import asks_of
from router.request.attempt import Attempter
from router.request.bookkeeping import Books
from router.request.breaker import Breakers
from router.request.budget import hedge_budget, retry_budget
from router.request.hedge import race
from router.request.job import NO_CLIENT, Client, Facts, Job, ms_since
from router.request.mirror import mirrored
from router.request.placement import PlacementInputs, counts_pending, session_of, tie_key
from router.request.priority import batch_targets, batch_wait_s
from router.request.quota import Grant, Quota, worst_case
from router.request.reply import REQUEST_ID_HEADER, Reply, new_request_id
from router.request.spans import end_span
from router.request.upstream import Upstream
from router.request.walk import Walk, tidegate_headers
from router.signals.loop import Signals
from router.state.roles import Leases

_MAX_RETRY_AFTER_S = 30.0

log = logging.getLogger("tidegate")


class Dispatcher:
    """Serves a request over a model's targets. Its collaborators are built and wired once,
    in router/app.py; each one sees only the role of the state store it needs."""

    def __init__(
        self,
        config: GatewayConfig,
        leases: Leases,
        upstream: Upstream,
        *,
        books: Books,
        policies: Mapping[str, Policy],
        signals: Signals,
        breakers: Breakers,
        telemetry: Telemetry,
        quota: Quota | None = None,
        fleet: Fleet | None = None,
        placement: PlacementInputs | None = None,
    ) -> None:
        self._config = config
        self._fleet = fleet  # DNS pools' live replicas (router/fleet/); None: the config's endpoints
        self._quota = quota
        self._limits = config.limits
        self._signals = signals
        self._budgets = {name: retry_budget(model.retry) for name, model in config.models.items()}
        self._hedges = {
            name: hedge_budget(m.hedge) for name, m in config.models.items() if m.hedge is not None
        }
        self._telemetry = telemetry
        self._books = books
        self._policies = policies
        self._placement = placement or PlacementInputs(config.models)
        self._counts_pending = {name: counts_pending(model) for name, model in config.models.items()}
        self._attempt = Attempter(
            config, leases, upstream, books=books, signals=signals, breakers=breakers, telemetry=telemetry
        )

    async def dispatch(
        self,
        path: str,
        body: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        received_at: float,
        client: Client = NO_CLIENT,
        *,
        request_id: str | None = None,
        grant: Grant | None = None,
    ) -> Reply:
        """Serve one OpenAI request body for `path` (relative to /v1). Raises ClientError
        for a request the gateway itself rejects; every other outcome is a Reply, recorded,
        with every slot it took given back (or handed to the Reply's `on_close`). `grant`:
        what the request's key counted before its body was read (router/request/quota.py)."""
        job = self._job(path, body, headers, received_at, client, request_id=request_id or new_request_id())
        del body  # from here the request holds only what it sends upstream (docs/security.md)
        if self._quota is not None and client.key is not None:  # a named key's reservation, first
            limits, request = self._limits, job.facts.request
            worst = worst_case(
                request, job.facts.config, limits.reserved_output_tokens, limits.request_timeout_s
            )
            job.grant = await self._quota.reserve(client.key, grant, worst)
        job.span = self._telemetry.start_request(path, job.facts.request.model, headers)
        deadline = job.facts.deadline
        model = job.facts.request.model
        self._budgets[model].request()
        hedges = self._hedges.get(model)
        if hedges is not None:
            hedges.request()
        try:
            async with asyncio.timeout_at(deadline):  # a stream's relay keeps to it too
                reply = await self._attempts(job)
        except UpstreamFailure as exc:
            reply = self._failed(job, exc)
        except TimeoutError:
            reply = self._failed(job, RequestTimeout(REQUEST_TIMEOUT_MESSAGE))
        except asyncio.CancelledError:  # the client left (or the server stops) before an answer
            self._books.record(job, job.walk.last, 499, Measures(error="client_gone"), Outcome.CLIENT_GONE)
            raise
        except Exception as exc:  # a bug of ours: logged and recorded, never a lost request
            log.exception("internal error while dispatching %s for %s", path, model)
            reply = self._failed(job, GatewayError(INTERNAL_ERROR_MESSAGE, detail=repr(exc)))
        if job.grant is not None:
            reply.headers.update(job.grant.headers)
        served = job.walk.last
        if job.facts.prefix_blocks and isinstance(served, DedicatedEndpoint) and reply.status < 400:
            self._placement.served(model, served.name, job.facts.prefix_blocks)
        return reply

    def _job(
        self,
        path: str,
        body: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        received_at: float,
        client: Client,
        *,
        request_id: str,
    ) -> Job:
        """The request as the policy decided it: its facts fixed, its walk ready, its span
        started. ClientError for a request the gateway itself rejects."""
        limits = self._limits
        ask_usage = path in PATHS and PATHS[path].done_terminated
        request = peek(body, limits.max_output_tokens, limits.max_n, ask_usage=ask_usage)
        config = self._config.models.get(request.model)
        if config is None:
            raise ModelNotFound(f"The model `{request.model}` does not exist", param="model")
        asks = asks_of(headers)
        session = asks.session
        key = _stickiness(request, session)
        counted = self._counts_pending[request.model]
        remaining_s = limits.request_timeout_s - ms_since(received_at) / 1000.0
        batch_wait = batch_wait_s(config, client.key, asks, remaining_s)
        exempt = batch_wait is not None and config.routing.batch.canary == "dedicated"
        task_id = _task_id(asks.task_id)
        context = RequestContext(request.model, request.stream, key, request.prompt_tokens, exempt)
        blocks: tuple[int, ...] = ()
        endpoints = self._fleet.endpoints(request.model) if self._fleet else config.endpoints
        if len(config.dedicated) > 1:  # replicas to choose among (policies/placement.py)
            blocks, hits = self._placement.read(config, request.model, request.body)
            context = replace(context, session=session_of(session, task_id), prefix_hits=hits)
            context = replace(context, placement_key=tie_key(request.user, blocks))
        snapshot = self._signals.snapshot()
        decision = self._policies[request.model].decide(context, snapshot, endpoints)
        targets = decision.targets if batch_wait is None else batch_targets(config, decision.targets)
        facts = Facts(
            path=path,
            request=request,
            config=config,
            headers=headers,
            received_at=received_at,
            snapshot=snapshot,
            stickiness_key=key,
            client=client,
            deadline=asyncio.get_running_loop().time() + remaining_s,
            queue_ms=decision.queue_ms,
            request_id=request_id,
            task_id=task_id or request_id,
            admit_within=decision.admit_within,
            prompt_tokens=request.prompt_tokens if counted else 0,
            mirrored=mirrored(config, request, request_id, asks.no_shadow),
            batch_wait_s=batch_wait,
            prefix_blocks=blocks,
        )
        _some_endpoint(targets, request.model)
        job = Job(facts, Walk(targets, decision.reason, placement=decision.placement))
        self._attempt.body_for(job, targets[0])  # a body we cannot forward is the client's 400
        return job

    async def _attempts(self, job: Job) -> Reply:
        """The first attempt runs bare (most requests need no other); after a failure that
        may be retried, tenacity owns the backoff and stop rules for the rest."""
        try:
            return await self._first_attempt(job)
        except UpstreamFailure as exc:
            if not self._should_retry(job, exc, 1):
                raise
            wait_s = self._wait(job, exc, 1)
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        retrying = AsyncRetrying(
            stop=stop_after_attempt(job.facts.config.retry.attempts - 1),
            wait=lambda state: self._wait(job, _failure(state), state.attempt_number + 1),
            retry=lambda state: self._should_retry(job, _failure(state), state.attempt_number + 1),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._attempt.run(job)
        raise AssertionError("tenacity ended without an outcome")  # pragma: no cover

    async def _first_attempt(self, job: Job) -> Reply:
        """The first attempt; a stream of a hedged model whose first target is dedicated races
        a serverless hedge once its request has been out `hedge.after_ms` (router/request/hedge.py)."""
        hedge = job.facts.config.hedge
        if hedge is None or not job.facts.request.stream or not isinstance(job.walk.next, DedicatedEndpoint):
            return await self._attempt.run(job)
        job.sent = asyncio.Event()
        hedge_job: Job | None = None

        def start_hedge() -> Coroutine[Any, Any, Reply] | None:
            nonlocal hedge_job
            target = next((t for t in job.walk.targets if isinstance(t, ServerlessEndpoint)), None)
            if target is None or not isinstance(job.walk.last, DedicatedEndpoint):
                return None  # nothing to hedge with, or the first attempt went serverless anyway
            if not self._hedges[job.facts.request.model].try_spend():
                return None
            hedge_job = job.hedge_to(Walk((target,), Reason.HEDGED))
            return self._attempt.run(hedge_job)

        raced = await race(self._attempt.run(job), job.sent, hedge.after_ms / 1000, start_hedge, _discard)
        if not raced.hedged:
            return raced.answer
        assert hedge_job is not None
        winner, loser = (hedge_job, job) if raced.hedge_won else (job, hedge_job)
        self._settle_hedge(winner, loser, raced.answer, hedge_won=raced.hedge_won)
        return raced.answer

    def _settle_hedge(self, winner: Job, loser: Job, reply: Reply, *, hedge_won: bool) -> None:
        """The winner's walk holds both attempts, the first attempt's first (a loser that was
        still running is `HedgeLost`), and its answer's headers say so. A hedge that lost
        before it was even sent cost nothing."""
        lost = list(loser.walk.attempts)
        target = loser.walk.last
        if target is not None and not lost:  # cancelled: its own record of it comes too late
            lost.append(Attempt(target.name, "HedgeLost", ms_since(loser.attempt_started)))
            end_span(loser.attempt_span, "HedgeLost")
        walk = winner.walk
        walk.attempts[:] = [*lost, *walk.attempts] if hedge_won else [*walk.attempts, *lost]
        walk.hedged = True
        served = walk.last
        assert served is not None
        duplicate = winner.facts.request.prompt_tokens if target is not None else 0
        loser_name = (target or loser.walk.targets[0]).name
        winner.hedge = Hedge(served.kind.value, loser_name, duplicate)
        reply.headers.update(tidegate_headers(walk, walk.served_outcome(), winner.overhead_ms, served.model))

    def _should_retry(self, job: Job, exc: BaseException | None, attempt_number: int) -> bool:
        """Retry a retryable failure while attempts remain. Failing over to another endpoint
        is always allowed; trying the same endpoint again spends the model's retry budget
        (that is what multiplies load on a struggling upstream), and is not done at all for
        a failure another try cannot mend (`retry_same`). A refusal is recorded."""
        if not isinstance(exc, UpstreamFailure) or not exc.is_retryable:
            return False
        if attempt_number >= job.facts.config.retry.attempts:
            return False
        if _fails_over(job, exc):
            return True
        if not exc.retry_same or isinstance(exc, NoCapacity):  # full: the client's SDK retries
            return False
        if self._budgets[job.facts.request.model].try_spend():
            return True
        job.budget_denied = True
        return False

    def _failed(self, job: Job, exc: GatewayError) -> Reply:
        if isinstance(exc, UpstreamStatus) and not exc.is_retryable:
            outcome = Outcome.CLIENT_ERROR
        elif isinstance(exc, UpstreamFailure | RequestTimeout):
            outcome = Outcome.EXHAUSTED
        else:
            outcome = Outcome.INTERNAL_ERROR
        headers = tidegate_headers(job.walk, outcome)
        headers[REQUEST_ID_HEADER] = headers["x-request-id"] = job.facts.request_id
        headers.update(self._retry_advice(job, exc, outcome))
        headers["content-type"] = "application/json"
        measures = Measures(error=type(exc).__name__, code=exc.code)
        self._books.record(job, job.walk.last, exc.status_code, measures, outcome)
        return Reply(exc.status_code, headers, exc.body())

    def _retry_advice(self, job: Job, exc: GatewayError, outcome: Outcome) -> dict[str, str]:
        """What the SDK is told about retrying. A request no upstream saw (every slot taken)
        is retryable, after the expected wait for a slot; one the gateway already retried (or
        whose retry budget said no more) is not: an SDK retrying on top would multiply the
        load, and wait out a Retry-After the gateway already did."""
        if isinstance(exc, NoCapacity) and not job.walk.attempts:
            return {"x-should-retry": "true", "retry-after": f"{self._slot_wait_s(job):g}"}
        if outcome is Outcome.EXHAUSTED and (len(job.walk.attempts) > 1 or job.budget_denied):
            return {"x-should-retry": "false"}
        if exc.retry_after_s is not None:
            return {"retry-after": f"{exc.retry_after_s:g}"}
        return {}

    def _slot_wait_s(self, job: Job) -> int:
        """Whole seconds until a dedicated slot is likely free: the shortest, over the model's
        pools, of its median answer time x (those in line + 1) / its slots; 1 s when unknown,
        at most `_MAX_RETRY_AFTER_S`."""
        snapshot, model = self._signals.snapshot(), job.facts.request.model
        waits = []
        for pool in job.facts.config.dedicated:
            figures = snapshot.e2e.get(route_key(model, pool.name))
            if figures is not None:
                ahead = snapshot.waiting.get(pool.name, 0) + 1
                waits.append(figures.p50 / 1000 * ahead / pool.max_concurrency)
        wait = min(waits) if waits else 1.0
        return max(1, min(math.ceil(wait), int(_MAX_RETRY_AFTER_S)))

    def _wait(self, job: Job, exc: BaseException | None, attempt_number: int) -> float:
        """No wait before a different endpoint; backoff or Retry-After before the same one."""
        if _fails_over(job, exc):
            return 0.0
        if isinstance(exc, GatewayError) and exc.retry_after_s is not None:
            wait = min(exc.retry_after_s, _MAX_RETRY_AFTER_S)
        else:
            base = job.facts.config.retry.backoff_ms / 1000.0 * 2.0 ** (attempt_number - 1)
            wait = base * random.uniform(0.5, 1.0)
        job.backoff_ms += wait * 1000
        return wait


async def _discard(reply: Reply) -> None:
    """A hedge race's late answer: its upstream closed and its slot released, unrecorded."""
    if reply.stream is not None and hasattr(reply.stream, "aclose"):
        await reply.stream.aclose()
    if reply.discard is not None:
        await reply.discard()


def _failure(state: RetryCallState) -> BaseException | None:
    return state.outcome.exception() if state.outcome else None


def _fails_over(job: Job, exc: BaseException | None) -> bool:
    """Whether the next attempt goes to another endpoint (no capacity anywhere is not one)."""
    return job.walk.fails_over and not isinstance(exc, NoCapacity)


def _task_id(text: str | None) -> str | None:
    """The client's `x-tidegate-task-id`: up to 128 of [A-Za-z0-9._:-], else a 400."""
    if text is None:
        return None
    if not valid_task_id(text):
        raise InvalidRequest(
            "x-tidegate-task-id must be 1 to 128 characters of A-Z, a-z, 0-9, '.', '_', ':' or '-'",
            param="x-tidegate-task-id",
        )
    return "t:" + text  # never equal to a request id


def _stickiness(request: RequestPeek, session: str | None) -> str:
    """The request's `user`, else its `x-tidegate-session` header, else a random key."""
    if request.user:
        return request.user
    if session is not None:
        return session
    return f"{random.getrandbits(64):016x}"  # a spread, not a secret: no syscall per request


def _some_endpoint(targets: Sequence[object], model: str) -> None:
    """A pool found by DNS with no replica now, and nothing beside it: 503, try again shortly."""
    if not targets:
        raise NoCapacity(
            f"No endpoint of `{model}` is up: its dedicated pool has no replica now "
            "(its DNS name resolves to none); try again shortly",
            headers={"retry-after": "1"},
        )
