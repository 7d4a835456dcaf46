"""Shadow traffic: a sampled share of a model's live requests (router/request/mirror.py) is
sent again, once the client's answer is chosen and recorded, to the model's shadow endpoint,
and its answer is judged by the same automatic success checks plus the `compare` rule against
the live answer (router/record/agreement.py). The client never waits for it, never sees it,
and no latency of it is charged to the request.

Bounds, each a documented drop reason (`tidegate_shadow_total{endpoint,result}`):
- `busy`: `max_in_flight` shadow requests of this model are already out on this replica;
- `no_free_slot`: a dedicated shadow endpoint takes a slot only while `min_free_percent` of
  its pool is free, acquired without waiting (never ahead of, nor instead of, a live request:
  the store's acquire is FIFO and the shadow asks for a smaller pool);
- `capped`: the day's `max_usd_per_day` is spent. The spend is counted in the store's ledger
  per model, endpoint and UTC day, across replicas and leader changes; each request reserves
  its worst case before it is sent (its estimated prompt plus its output bound, times its `n`
  or `best_of`: the output bound is the client's token limit, else `DEFAULT_OUTPUT_TOKENS`, and
  the mirrored request is sent with that bound as its limit), then settles to what its answer
  cost, so the cap is never passed;
- `same_route`: the live answer came from the shadow endpoint itself.

What a sent shadow request found: `agree`, `disagree`, `not_compared` (no rule, or nothing of
the live answer to compare: a Responses API answer is checked, not compared), `failed_check`
(the automatic checks failed; counted before agreement) or `error` (no answer). Per endpoint,
the store counts `shadow`, `shadow_usd` (actual, from usage), `shadow_ok`, `shadow_agree`,
`shadow_compared` and `shadow_failed`, shown by `/admin/routes` and the economics report as
the shadow's own line, never mixed into the route's cost or success.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
import orjson
from prometheus_client import CollectorRegistry, Counter

from policies.types import is_dedicated, route_key
from router.config import Endpoint, GatewayConfig, ModelConfig, ServerlessEndpoint, ShadowConfig
from router.economics.cost import token_cost_usd
from router.errors import StoreUnavailable, UpstreamFailure
from router.openai import RequestPeek
from router.record.agreement import agrees
from router.record.answer import Answer, from_shape, read_answer
from router.record.success import AnswerShape, judge
from router.request.job import Job
from router.request.relay import usage_of
from router.request.upstream import Upstream
from router.state.roles import Leases, Samples, Spend
from router.state.slots import Lease, Slots

log = logging.getLogger("tidegate.shadow")
_DAY_S = 86400
DEFAULT_OUTPUT_TOKENS = 256  # a request without max_tokens, for the reservation
_APIS = {"/chat/completions": "chat", "/responses": "responses"}


class ShadowStore(Protocol):
    """The store's roles a shadow uses (router/state/roles.py)."""

    @property
    def leases(self) -> Leases: ...

    @property
    def spend(self) -> Spend: ...

    @property
    def series(self) -> Samples: ...


@dataclass(frozen=True, slots=True)
class Twin:
    """A mirrored request's shadow: where it goes and what the live answer was."""

    model: str
    config: ModelConfig
    shadow: ShadowConfig
    target: Endpoint
    path: str
    request: RequestPeek
    live: Answer

    @property
    def output_tokens(self) -> int:
        """The output bound the shadow request reserves and is sent with."""
        return self.request.output_limit or DEFAULT_OUTPUT_TOKENS

    @property
    def ledger(self) -> str:
        return f"shadow:{route_key(self.model, self.target.name)}:{int(time.time() // _DAY_S)}"


class Shadow:
    def __init__(
        self,
        config: GatewayConfig,
        store: ShadowStore,
        upstream: Upstream,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._store = store
        self._upstream = upstream
        self._targets = {name: m.shadow_target() for name, m in config.models.items() if m.shadow is not None}
        self._in_flight: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.results = Counter(
            "tidegate_shadow",
            "Shadow requests by endpoint and result (sent: agree, disagree, not_compared, failed_check, "
            "error; dropped: busy, no_free_slot, capped, same_route)",
            ("endpoint", "result"),
            registry=registry,
        )

    def offer(self, job: Job, live: Endpoint, shape: AnswerShape) -> None:
        """A mirrored request was answered by `live`: send its twin, unless a bound says no."""
        facts = job.facts
        model, config = facts.request.model, facts.config
        target, shadow = self._targets.get(model), config.shadow
        if target is None or shadow is None:
            return
        if target.name == live.name:
            self.results.labels(target.name, "same_route").inc()
            return
        if self._in_flight.get(model, 0) >= shadow.max_in_flight:
            self.results.labels(target.name, "busy").inc()
            return
        self._in_flight[model] = self._in_flight.get(model, 0) + 1
        twin = Twin(model, config, shadow, target, facts.path, facts.request, from_shape(shape))
        task = asyncio.get_running_loop().create_task(self._mirror(twin))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _mirror(self, twin: Twin) -> None:
        target = twin.target
        lease: Lease | None = None
        reserved: float | None = None
        try:
            reserved = await self._reserve(twin)
            if reserved is None:
                self.results.labels(target.name, "capped").inc()
                return
            if is_dedicated(target):
                lease = await self._free_slot(twin)
                if lease is None:
                    self.results.labels(target.name, "no_free_slot").inc()
                    return
            spent = await self._send(twin)
            await self._settle(twin, reserved, spent)
            reserved = None
        except Exception as exc:  # the shadow never takes the loop down; its failure is counted
            log.warning("shadow request to %s failed: %r", target.name, exc)
            self.results.labels(target.name, "error").inc()
        finally:
            self._in_flight[twin.model] -= 1
            if lease is not None:
                await self._store.leases.release(lease)

    async def _reserve(self, twin: Twin) -> float | None:
        """Reserve the request's worst-case spend in the day's shared ledger: what was
        reserved (0 for a dedicated pool, paid for by the hour), None when the cap says no."""
        target = twin.target
        if not isinstance(target, ServerlessEndpoint):
            return 0.0
        request = twin.request
        output = twin.output_tokens * request.sequences
        usd = token_cost_usd(
            request.prompt_tokens + 8, output, target.usd_per_mtok_in, target.usd_per_mtok_out
        )
        try:
            fits = await self._store.spend.try_spend(
                twin.ledger, usd, twin.shadow.max_usd_per_day, 2 * _DAY_S
            )
        except StoreUnavailable:
            return None  # no spend that cannot be counted
        return usd if fits else None

    async def _settle(self, twin: Twin, reserved: float, spent: float) -> None:
        """The ledger keeps what the answer cost, not the reservation."""
        if reserved > 0 and spent != reserved:
            try:
                await self._store.spend.settle_spend(twin.ledger, spent - reserved)
            except StoreUnavailable as exc:  # the reservation stays: the cap errs on the safe side
                log.warning("shadow spend of %s not settled: %s", twin.target.name, exc)

    async def _free_slot(self, twin: Twin) -> Lease | None:
        capacity = twin.target.max_concurrency or 0
        usable = int(capacity * (100.0 - twin.shadow.min_free_percent) / 100.0)
        if usable < 1:
            return None
        return await self._store.leases.try_acquire(twin.target.name, Slots(capacity=usable, max_waiters=0))

    async def _send(self, twin: Twin) -> float:
        """Send the twin and count what it found; what its answer cost."""
        target = twin.target
        try:
            async with asyncio.timeout(twin.shadow.timeout_s):
                response = await self._upstream.open(target, twin.path, shadow_body(twin), ())
                try:
                    raw = await response.aread()
                finally:
                    await response.aclose()
        except (UpstreamFailure, TimeoutError) as exc:
            self._count(twin, "error", usd=0.0)
            log.info("shadow request to %s got no answer: %s", target.name, exc)
            return 0.0
        parsed, api = _parsed(raw), _APIS.get(twin.path)
        if parsed is None or api is None:
            self._count(twin, "error", usd=0.0)
            return 0.0
        usd = _cost(target, parsed)
        self._count(twin, _result(twin, parsed, read_answer(api, parsed)), usd=usd)
        return usd

    def _count(self, twin: Twin, result: str, *, usd: float) -> None:
        self.results.labels(twin.target.name, result).inc()
        self._store.series.count(
            route_key(twin.model, twin.target.name),
            {
                "shadow": 1.0,
                "shadow_usd": usd,
                "shadow_ok": float(result in ("agree", "disagree", "not_compared")),
                "shadow_failed": float(result in ("failed_check", "error")),
                "shadow_compared": float(result in ("agree", "disagree")),
                "shadow_agree": float(result == "agree"),
            },
        )

    def start(self) -> None:
        """Nothing runs until a mirrored request is answered."""

    async def close(self) -> None:
        """Cancel the shadow requests still out (they are nobody's answer)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _result(twin: Twin, parsed: Mapping[str, Any], answer: Answer) -> str:
    config, live = twin.config, twin.live
    shape = AnswerShape()
    shape.take_choices(parsed.get("choices"), config.success.max_checked_bytes, collect=True)
    if "choices" not in parsed:  # a Responses API answer: its finish as the checks know it
        shape.finish_reasons.append(answer.finish_reason or "stop")
    if judge(shape, config.success, twin.request) is not None:
        return "failed_check"
    rules = twin.shadow.compare.rules()
    has_live = bool(live.text or live.tool_calls)
    agreed = agrees(rules, answer, [live]) if has_live else None
    return "not_compared" if agreed is None else "agree" if agreed else "disagree"


def shadow_body(twin: Twin) -> bytes:
    """The live request's body for the shadow endpoint: its model id, not streamed, and with
    the output bound it reserved as its token limit (the client's own, when it set one)."""
    fields = twin.request.body.fields()
    for name in ("model", "stream", "stream_options"):
        fields.pop(name, None)
    if not twin.request.caps_output:
        fields[_LIMIT_FIELD.get(twin.path, "max_tokens")] = msgspec.Raw(b"%d" % twin.output_tokens)
    return (
        b'{"model":'
        + orjson.dumps(twin.target.model)
        + (b"," + msgspec.json.encode(fields)[1:] if fields else b"}")
    )


_LIMIT_FIELD = {"/responses": "max_output_tokens"}


def _parsed(raw: bytes) -> dict[str, Any] | None:
    try:
        found = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None


def _cost(target: Endpoint, parsed: Mapping[str, Any]) -> float:
    """What the shadow answer cost: its usage read as the live answers' is (usage_of)."""
    usage = usage_of(parsed)
    if not isinstance(target, ServerlessEndpoint) or usage is None:
        return 0.0
    return token_cost_usd(
        usage.input_tokens or 0, usage.output_tokens or 0, target.usd_per_mtok_in, target.usd_per_mtok_out
    )
