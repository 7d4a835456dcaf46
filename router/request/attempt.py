"""One attempt at one target: admit (a dedicated slot, or none for serverless), call the
upstream, and shape its answer into a Reply, with the slot given back on every path: at any
await of the attempt, an exception releases it, unless the Reply now owns it (and releases it
in its `on_close`, after the books are written)."""

from __future__ import annotations

import asyncio
import random
import time

import anyio
import httpx

from policies.types import route_key
from router.config import DedicatedEndpoint, Endpoint, GatewayConfig, ResponseModel
from router.errors import NoCapacity, UpstreamFailure
from router.openai import PATHS, model_renamer
from router.record.records import Attempt
from router.record.telemetry import Telemetry, trace_headers
from router.request.bookkeeping import Books
from router.request.breaker import Breakers
from router.request.job import Job, ms_since, overhead_ms
from router.request.priority import POLL_S
from router.request.relay import SseRelay, StreamResult, relay_stream
from router.request.reply import REQUEST_ID_HEADER, Reply
from router.request.spans import end_span
from router.request.upstream import Upstream, response_headers
from router.request.walk import tidegate_headers
from router.signals.loop import Signals
from router.state.latency import Metric
from router.state.roles import Leases
from router.state.slots import Lease, Slots


class Attempter:
    def __init__(
        self,
        config: GatewayConfig,
        leases: Leases,
        upstream: Upstream,
        *,
        books: Books,
        signals: Signals,
        breakers: Breakers,
        telemetry: Telemetry,
    ) -> None:
        self._limits = config.limits
        self._store = leases
        self._upstream = upstream
        self._books = books
        self._signals = signals
        self._breakers = breakers
        self._telemetry = telemetry
        self._background: set[asyncio.Task[None]] = set()  # prefill ends being recorded
        # per (model, endpoint): the rewrite of an answer's model to the requested name
        self._renamers = {
            (name, e.name): None
            if model.response_model is ResponseModel.UPSTREAM
            else model_renamer(e.model, name)
            for name, model in config.models.items()
            for e in model.endpoints
        }

    async def run(self, job: Job) -> Reply:
        """One attempt. Whatever happens inside it, at any await, the slot it took is given
        back, unless a Reply now owns it (and releases it in its `on_close`)."""
        target, lease = await self._admit(job)
        try:
            return await self._call(job, target, lease)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.release(lease)
            raise

    async def _call(self, job: Job, target: Endpoint, lease: Lease | None) -> Reply:
        facts, walk = job.facts, job.walk
        started = job.attempt_started = time.monotonic()
        body = self.body_for(job, target)
        job.attempt_span = self._telemetry.start_attempt(job.span, len(walk.attempts) + 1, target)
        context = trace_headers(job.attempt_span)
        route = route_key(facts.request.model, target.name)
        response: httpx.Response | None = None
        if job.sent is not None:
            job.sent.set()
        try:
            response = await self._upstream.open(
                target, facts.path, body, facts.headers, trace_context=context, client_ip=facts.client.ip
            )
            if facts.request.stream:
                reply = await self._stream_reply(job, target, response, lease)
            else:
                reply = await self._body_reply(job, target, response)
        except UpstreamFailure as exc:
            walk.failed(Attempt(target.name, type(exc).__name__, ms_since(started), exc.detail))
            end_span(job.attempt_span, type(exc).__name__)
            if exc.blames_endpoint:
                self._breakers.record(route, False, facts.snapshot)
            raise
        except BaseException as exc:  # cancelled, or a bug: close what was opened, shielded
            name = "Cancelled" if isinstance(exc, asyncio.CancelledError) else type(exc).__name__
            walk.ended(Attempt(target.name, name, ms_since(started)))
            if response is not None:
                with anyio.CancelScope(shield=True):
                    await response.aclose()
            raise
        walk.ended(Attempt(target.name, None, ms_since(started)))  # served: open() raised for non-2xx
        self._breakers.record(route, True, facts.snapshot)
        job.overhead_ms = overhead_ms(job)
        reply.headers.update(tidegate_headers(walk, walk.served_outcome(), job.overhead_ms, target.model))
        reply.headers[REQUEST_ID_HEADER] = facts.request_id
        reply.headers.setdefault("x-request-id", facts.request_id)  # the upstream's, when it sent one
        if reply.stream is None:
            reply.on_close = lambda: self._close_body(job, target, reply, lease)
        return reply

    async def _close_body(self, job: Job, target: Endpoint, reply: Reply, lease: Lease | None) -> None:
        """After a body reply was sent (or failed to send): record, then release the slot (see
        the stream's `close`)."""
        try:
            self._books.body_done(job, target, reply.status, reply.body)
        finally:
            await self.release(lease)

    async def _admit(self, job: Job) -> tuple[Endpoint, Lease | None]:
        """The next target that admits the request, walking on from the cursor; a dedicated
        pool that is full, or too small for the request's sequences, is skipped (`saturated`)."""
        walk, sequences = job.walk, job.facts.request.sequences
        for skipped, target in walk.ahead():
            if not isinstance(target, DedicatedEndpoint):
                walk.begin(target, skipped)
                return target, None
            if sequences > target.max_concurrency:  # n/best_of would never fit
                walk.saturated()
                continue
            lease = await self._acquire(job, target, first=skipped == 0 and not walk.attempts)
            if lease is not None:
                self._signals.dispatched(target.name)
                walk.begin(target, skipped)
                return target, lease
            walk.saturated()
        walk.pool_full()
        raise NoCapacity(f"every dedicated endpoint of {job.facts.request.model} is at capacity")

    async def _acquire(self, job: Job, target: DedicatedEndpoint, *, first: bool) -> Lease | None:
        """A slot on `target`; the first try may wait in line as long as the policy allowed."""
        facts = job.facts
        if facts.batch_wait_s is not None:
            return await self._acquire_batch(job, target, facts.batch_wait_s if first else 0.0)
        wait_s = job.facts.queue_ms / 1000.0 if first else 0.0
        slots = Slots(
            target.max_concurrency,
            facts.request.sequences,
            target.max_waiters,
            facts.prompt_tokens,
            facts.admit_within.get(target.name),
        )
        if wait_s <= 0:
            return await self._store.try_acquire(target.name, slots)
        started = time.monotonic()
        lease = await self._store.try_acquire(target.name, slots, wait_s)
        job.queue_ms = ms_since(started)
        self._books.observe(route_key(job.facts.request.model, target.name), Metric.QUEUE, job.queue_ms)
        return lease

    async def _acquire_batch(self, job: Job, target: DedicatedEndpoint, wait_s: float) -> Lease | None:
        """A batch request's slot (router/request/priority.py): asked for outside the line, on
        the pool less its reserve, again every POLL_S (jittered) until `wait_s` is over."""
        facts = job.facts
        reserve = min(facts.config.routing.batch.reserve_slots, target.max_concurrency - 1)
        slots = Slots(target.max_concurrency - reserve, facts.request.sequences, 0, facts.prompt_tokens)
        started = time.monotonic()
        lease = await self._store.try_acquire(target.name, slots)
        while lease is None and time.monotonic() - started < wait_s:
            await asyncio.sleep(
                min(POLL_S * (0.5 + random.random()), max(0.0, started + wait_s - time.monotonic()))
            )
            lease = await self._store.try_acquire(target.name, slots)
        job.queue_ms = ms_since(started)
        self._books.observe(route_key(facts.request.model, target.name), Metric.QUEUE, job.queue_ms)
        return lease

    async def _body_reply(self, job: Job, target: Endpoint, response: httpx.Response) -> Reply:
        payload = await self._upstream.read(response, target, self._limits.max_response_bytes)
        rename = self._renamers[(job.facts.request.model, target.name)]
        if rename is not None:
            payload = rename(payload)
        return Reply(response.status_code, response_headers(response), payload)

    async def _stream_reply(
        self, job: Job, target: Endpoint, response: httpx.Response, lease: Lease | None
    ) -> Reply:
        """Wait for the upstream's first whole event before answering the client: until then a
        stall or a failure can still be retried elsewhere."""
        facts = job.facts
        done_terminated = PATHS[facts.path].done_terminated
        result = StreamResult()
        checks = facts.config.success
        relay = SseRelay(
            result,
            drop_usage=done_terminated and not facts.request.wants_usage,
            max_event_bytes=self._limits.max_event_bytes,
            rename=self._renamers[(facts.request.model, target.name)],
            collect_bytes=checks.max_checked_bytes
            if (checks.check_json and facts.request.wants_checks) or facts.mirrored
            else 0,
            responses=facts.path == "/responses",
        )
        chunks = self._upstream.chunks(response, target, facts.deadline)
        try:
            first = await self._upstream.first_event(response, chunks, target, relay)
        except UpstreamFailure:
            await response.aclose()
            raise
        if lease is not None and lease.prompt_tokens > 0:
            self._prefilled(job, lease)
        relayed = relay_stream(relay, first, chunks, expect_done=done_terminated)

        async def discard() -> None:
            await response.aclose()
            await self.release(lease)

        async def close() -> None:
            """Record, then release: a Redis release waits for company (the next request's
            acquire), and the books must not run inside that request's wait."""
            try:
                await response.aclose()
                if isinstance(result.error, UpstreamFailure):  # the upstream failed mid-stream
                    self._breakers.record(route_key(facts.request.model, target.name), False, facts.snapshot)
                self._books.stream_done(job, target, response.status_code, result)
            finally:
                await self.release(lease)

        return Reply(
            response.status_code,
            response_headers(response),
            stream=relayed,
            on_close=close,
            result=result,
            discard=discard,
            error_event=relay.error_event,
        )

    def _prefilled(self, job: Job, lease: Lease) -> None:
        """The first event is here: the prompt is prefilled. Teach the pool's prefill model,
        and take the tokens off its pending count in the background (not on the TTFT path;
        the release takes them off too, whichever comes first)."""
        self._signals.first_token(lease.pool, lease.pending_at_admit, ms_since(job.attempt_started))
        task = asyncio.get_running_loop().create_task(self._store.prefilled(lease))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def release(self, lease: Lease | None) -> None:
        if lease is not None:
            self._signals.completed(lease.pool)
            await self._store.release(lease)

    def body_for(self, job: Job, target: Endpoint) -> bytes:
        """The upstream body for `target` (router/openai.py UpstreamBody)."""
        return job.facts.request.body.for_model(target.model)
