"""A model's section: its routing policy, SLO, retries, breakers, success checks, canary
controller, hedging and its endpoints."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from policies.placement import Placement, Weights
from policies.predicted_ttft import Admission
from policies.serverless import ServerlessOrder
from router.config.endpoints import DedicatedEndpoint, Endpoint, ServerlessEndpoint
from router.config.frozen import Frozen


class SloConfig(Frozen):
    """The SLO guard: spill new requests off a dedicated route whose windowed p95 TTFT is over
    `ttft_p95_ms`; go back once it is at or under `recover_ratio` x that (or the window holds
    fewer than `min_samples`), never changing state within `dwell_s` of the last change."""

    ttft_p95_ms: Annotated[float, Field(gt=0)] | None = None  # None: no SLO guard
    # predicted-TTFT admission admits to dedicated while the prediction fits this (ms);
    # None: the SLO's p95 target
    ttft_budget_ms: Annotated[float, Field(gt=0)] | None = None
    # back on the route once its p95 TTFT is at or under this x the SLO
    recover_ratio: Annotated[float, Field(gt=0, le=1)] = 0.8
    min_samples: Annotated[int, Field(ge=1)] = 20  # fewer samples in the window: no verdict
    dwell_s: Annotated[float, Field(ge=0)] = 10.0  # no change of verdict within this long of the last

    @property
    def admission_budget_ms(self) -> float | None:
        return self.ttft_budget_ms if self.ttft_budget_ms is not None else self.ttft_p95_ms


class ResponseModel(StrEnum):
    REQUESTED = "requested"  # answers name the model the client asked for
    UPSTREAM = "upstream"  # answers keep the upstream's id (it is also in x-tidegate-upstream-model)


class BatchConfig(Frozen):
    """Requests of `batch` keys (docs/tenants.md): they wait for a dedicated slot behind every
    interactive request, never taking the pool's last `reserve_slots`, for up to `max_wait_s`
    (or the client's `x-tidegate-deadline-ms`, if sooner); then `on_timeout` decides: `reject`
    (503 with Retry-After) or `spill` to serverless like an interactive request. A pool keeps
    at most its size less one in reserve: a pool of one slot is batch's too. `canary`: whether
    the model's canary gate holds batch requests too (`follow`: outside it they go serverless
    as `canary_out`) or not (`dedicated`, the default: batch never pays serverless prices for
    being outside the canary)."""

    # a batch request waits this long for a slot (or x-tidegate-deadline-ms)
    max_wait_s: Annotated[float, Field(gt=0, le=3600)] = 300.0
    reserve_slots: Annotated[int, Field(ge=0)] = 1  # never takes a pool's last slots: interactive's
    on_timeout: Literal["reject", "spill"] = "reject"  # then: 503 with Retry-After, or spill to serverless
    # outside the canary: still dedicated, or follow the gate (canary_out)
    canary: Literal["dedicated", "follow"] = "dedicated"


class PlacementConfig(Frozen):
    """How a request picks among a model's dedicated replicas (docs/routing.md, "Placement"):
    `scored` ranks each by the prompt tokens waiting for prefill on it (in lengths of this
    request's prompt) plus `load_weight` x its load per slot, less `prefix_weight` x the share of
    the prompt's prefix it probably holds, less `session_weight` when it is the session's home;
    `least_loaded`, `round_robin` and `listed` (the first with room, in listed order) are the
    plain orders."""

    mode: Placement = Placement.SCORED  # scored, least_loaded, round_robin or listed
    load_weight: Annotated[float, Field(ge=0, le=100)] = 1.0  # per unit of busy share per slot
    # for holding the whole prefix (1: a cached token counts as one fewer token to compute)
    prefix_weight: Annotated[float, Field(ge=0, le=100)] = 1.0
    session_weight: Annotated[float, Field(ge=0, le=100)] = 0.3  # for being the session's home
    # the prompt's prefix is hashed in blocks of this many bytes of its JSON (~128 tokens)
    prefix_block_bytes: Annotated[int, Field(ge=64, le=65536)] = 512
    max_prefix_blocks: Annotated[int, Field(ge=1, le=4096)] = 128  # a longer prompt: its first blocks
    # blocks remembered per replica by each gateway process (LRU; size it to the replica's KV
    # cache: its tokens / 128 at the default block); 0: no prefix index
    index_blocks: Annotated[int, Field(ge=0, le=10_000_000)] = 4096

    @property
    def weights(self) -> Weights:
        return Weights(self.load_weight, self.prefix_weight, self.session_weight)

    @property
    def counts_pending(self) -> bool:
        """Whether each replica's prompt tokens waiting for prefill are counted (`scored` reads
        them; slots admission alone does not count them)."""
        return self.mode is Placement.SCORED

    @property
    def uses_prefix(self) -> bool:
        return self.mode is Placement.SCORED and self.prefix_weight > 0 and self.index_blocks > 0


class RoutingConfig(Frozen):
    # the spill order: as listed, or `fastest` by live p95 TTFT
    serverless: ServerlessOrder = ServerlessOrder.CONFIGURED
    min_samples: Annotated[int, Field(ge=1)] = 20  # before `fastest` trusts a route's figures
    explore_percent: Annotated[float, Field(ge=0, le=100)] = 5.0  # keys sent to unmeasured routes
    max_queue_ms: Annotated[float, Field(ge=0, le=10_000)] = 0.0  # wait for a dedicated slot; 0: spill
    admission: Admission = Admission.SLOTS  # or predicted_ttft (policies/predicted_ttft.py)
    batch: BatchConfig = BatchConfig()  # how batch keys' requests wait (router/request/priority.py)
    placement: PlacementConfig = PlacementConfig()  # which dedicated replica first (two or more)


class RetryConfig(Frozen):
    """Attempts after the first are retries; within `budget_window_s` a process makes at most
    `budget_percent` of the model's requests in retries (and always allows `min_retries`)."""

    attempts: Annotated[int, Field(ge=1, le=10)] = 3  # tries per request in all, across endpoints
    # the first retry waits this long, doubling (with jitter)
    backoff_ms: Annotated[float, Field(ge=0)] = 100.0
    # retries at most this share of the requests over the budget window
    budget_percent: Annotated[float, Field(ge=0, le=100)] = 20.0
    budget_window_s: Annotated[float, Field(gt=0)] = 10.0  # the retry budget counts over this window
    min_retries: Annotated[int, Field(ge=0)] = 3  # per window, so a quiet model can still retry


class BreakerConfig(Frozen):
    """Per endpoint: open after `consecutive_failures` failed attempts in a row, or when at
    least `min_requests` attempts in `window_s` failed at `error_rate_percent` or more. Open
    means skipped (`circuit_open`) for a cooldown of `cooldown_s`, doubled on each failed
    trial up to `max_cooldown_s`; after it the next requests are trials of the endpoint and a success
    closes it. Shared through the state store."""

    consecutive_failures: Annotated[int, Field(ge=1)] = 5  # open after this many failed attempts in a row ...
    error_rate_percent: Annotated[float, Field(gt=0, le=100)] = 50.0  # ... or this share failed ...
    min_requests: Annotated[int, Field(ge=1)] = 20  # ... of at least this many attempts ...
    window_s: Annotated[float, Field(gt=0)] = 10.0  # ... within this window
    cooldown_s: Annotated[float, Field(gt=0)] = 5.0  # skipped this long, doubled per failed probe ...
    max_cooldown_s: Annotated[float, Field(gt=0)] = 60.0  # ... up to this


class SuccessConfig(Frozen):
    """The automatic checks that decide a served answer succeeded (before any application
    feedback): its finish_reason is accepted, its tool-call arguments parse as JSON, and a
    `response_format` json_object/json_schema answer parses (and matches its schema)."""

    finish_reasons: tuple[str, ...] = ("stop", "tool_calls")  # `length` is a failure unless listed ...
    # ... or the caller's own max_tokens (max_completion_tokens, max_output_tokens) cut it: the
    # caller asked for at most that much, so by default the answer did what it was asked
    length_under_max_tokens: Literal["success", "failure"] = "success"
    check_json: bool = True  # tool-call arguments and JSON answers must parse
    max_checked_bytes: Annotated[int, Field(gt=0)] = 1024 * 1024  # of a stream's text kept for checks


class CanaryChecks(Frozen):
    """Dedicated against serverless over the same interval; a check whose figure is missing on
    a side (no samples) makes the analysis inconclusive, not failed. A latency check with no
    figure on either side (the TTFT and ITL ones when no request streamed) is skipped, as long
    as one latency check has figures on both (router/canary/analysis.py)."""

    # dedicated's p95 TTFT over serverless's, at most (streams)
    ttft_p95_max_ratio: Annotated[float, Field(gt=0)] | None = 1.2
    # dedicated's p95 TTFT in ms, at most (streams)
    ttft_p95_max_ms: Annotated[float, Field(gt=0)] | None = None
    # dedicated's median inter-token latency over serverless's, at most (streams)
    itl_p50_max_ratio: Annotated[float, Field(gt=0)] | None = 1.5
    # every answer's e2e per output token: the latency check non-streaming traffic can pass
    e2e_per_token_p95_max_ratio: Annotated[float, Field(gt=0)] | None = 1.2
    error_rate_max_percent: Annotated[float, Field(ge=0, le=100)] | None = 1.0  # dedicated, absolute
    success_rate_min_ratio: Annotated[float, Field(gt=0)] | None = 0.98  # dedicated / serverless
    cost_per_success_max_ratio: Annotated[float, Field(gt=0)] | None = None  # dedicated / serverless


class CanaryControllerConfig(Frozen):
    """Move the model's canary percent step by step while dedicated holds up against
    serverless (router/canary/controller.py)."""

    # the percents a run walks (or step_percent)
    steps: tuple[Annotated[float, Field(gt=0, le=100)], ...] = ()
    step_percent: Annotated[float, Field(gt=0, le=100)] | None = None  # instead of steps: +this ...
    max_percent: Annotated[float, Field(gt=0, le=100)] = 100.0  # ... up to this
    interval_s: Annotated[float, Field(gt=0)] = 300.0  # one analysis per interval
    min_samples: Annotated[int, Field(ge=1)] = 75  # requests per side and interval; fewer: hold
    # no caller (API key) weighs more than this share of a side's success and error rates
    max_caller_share: Annotated[float, Field(gt=0, le=1)] = 0.5
    min_callers: Annotated[int, Field(ge=1)] = 3  # fewer: the verdict says it rests on few callers
    checks: CanaryChecks = CanaryChecks()
    failure_threshold: Annotated[int, Field(ge=1)] = 2  # failed analyses in a row before on_failure
    # failure_threshold failures in a row: back to 0%, or pause
    on_failure: Literal["rollback", "hold"] = "rollback"
    start: Literal["manual", "auto"] = "manual"  # auto: start a run when the gateway starts (if idle)

    @model_validator(mode="after")
    def _one_way_to_step(self) -> CanaryControllerConfig:
        if self.steps and self.step_percent is not None:
            raise ValueError("give either steps or step_percent (with max_percent), not both")
        if not self.steps and self.step_percent is None:
            raise ValueError("give steps (e.g. [5, 10, 25, 50, 100]) or step_percent")
        if list(self.steps) != sorted(set(self.steps)):
            raise ValueError("steps must rise strictly")
        return self

    def plan(self) -> tuple[float, ...]:
        """The percents a run walks through, in order."""
        if self.steps:
            return self.steps
        assert self.step_percent is not None
        count = int(self.max_percent / self.step_percent + 1e-9)
        walk = [round(self.step_percent * (i + 1), 6) for i in range(count)]
        if not walk or walk[-1] < self.max_percent:
            walk.append(self.max_percent)
        return tuple(walk)


class HedgeConfig(Frozen):
    """A stream whose dedicated attempt has no first event `after_ms` after it was sent also
    starts its serverless attempt; the first of the two to produce a first event is relayed,
    the other cancelled at once (its slot released). At most `max_percent` of the model's
    requests hedge within `window_s` (per process), and always `min_hedges` (so the first
    stall after a quiet spell is hedged too); non-stream requests never hedge (their first
    byte is the whole answer). See router/request/hedge.py."""

    # a dedicated first token slower than this is raced by serverless
    after_ms: Annotated[float, Field(gt=0, le=600_000)]
    # of the requests over the window, at most this share hedged
    max_percent: Annotated[float, Field(gt=0, le=100)] = 5.0
    window_s: Annotated[float, Field(gt=0, le=3600)] = 60.0  # the hedge budget counts over this window
    min_hedges: Annotated[int, Field(ge=0, le=1000)] = 1  # per window, whatever the share


class ParityConfig(Frozen):
    """What an applied `tidegate parity` run does (docs/parity.md). With `enforce`, an endpoint
    whose last verdict is `diverges` leaves the spill order on every replica, and the canary
    controller holds (never steps up) while a dedicated endpoint's last verdict diverges.
    Without it the verdicts are only shown."""

    enforce: bool = False  # true: a diverging serverless endpoint leaves the spill order, the canary holds


class AgreeRules(Frozen):
    """How a shadow answer must agree with the live one (router/record/agreement.py)."""

    exact: bool = False  # the answers are the same text
    json_keys: bool = False  # the JSON answers have the same keys
    json_values: tuple[Annotated[str, Field(min_length=1)], ...] = ()  # these JSON paths have the same values
    tool_name: bool = False  # the same tool is called
    label: str | None = None  # a regular expression: the same first match in both

    @model_validator(mode="after")
    def _label_compiles(self) -> AgreeRules:
        if self.label is not None:
            try:
                re.compile(self.label)
            except re.error as exc:
                raise ValueError(f"label is not a regular expression: {exc}") from None
        return self

    def rules(self) -> dict[str, Any]:
        """The rules that are on, as the agreement module takes them."""
        found: dict[str, Any] = {k: True for k in ("exact", "json_keys", "tool_name") if getattr(self, k)}
        if self.json_values:
            found["json_values"] = list(self.json_values)
        if self.label is not None:
            found["label"] = self.label
        return found


class ShadowCompare(Frozen):
    # a rule's name alone (`agree: json_keys`) or several rules; none: the checks only
    agree: Literal["exact", "json_keys", "tool_name"] | AgreeRules | None = None

    def rules(self) -> dict[str, Any]:
        if self.agree is None:
            return {}
        return {self.agree: True} if isinstance(self.agree, str) else self.agree.rules()


class ShadowConfig(Frozen):
    """Mirror a sampled share of the model's live requests to another endpoint after the
    client's answer is chosen (router/spill/shadow.py): the client never waits for it or sees
    it. `endpoint` names one of the model's endpoints; `candidate` is one that takes no live
    traffic (a provider being evaluated). Give exactly one."""

    endpoint: str | None = None  # one of the model's endpoints to mirror to ...
    candidate: ServerlessEndpoint | None = None  # ... or a provider being evaluated (takes no live traffic)
    percent: Annotated[float, Field(gt=0, le=100)] = 1.0  # of live requests mirrored
    max_usd_per_day: Annotated[float, Field(ge=0)] = 5.0  # counted in the store, across replicas
    max_in_flight: Annotated[int, Field(ge=1, le=1000)] = 4  # per replica; more are dropped
    max_prompt_tokens: Annotated[int, Field(ge=1)] = 8000  # larger requests (estimated) are not mirrored
    # a dedicated shadow takes a slot only while at least this share of its pool is free
    min_free_percent: Annotated[float, Field(ge=0, le=100)] = 50.0
    timeout_s: Annotated[float, Field(gt=0, le=600)] = 60.0  # a shadow request is given up after this
    compare: ShadowCompare = ShadowCompare()  # when a shadow answer agrees with the live one

    @model_validator(mode="after")
    def _one_target(self) -> ShadowConfig:
        if (self.endpoint is None) == (self.candidate is None):
            raise ValueError(
                "give either endpoint (one of the model's) or candidate (an endpoint of its own)"
            )
        return self

    @property
    def target_name(self) -> str:
        return self.candidate.name if self.candidate is not None else str(self.endpoint)


class ModelConfig(Frozen):
    policy: str = "dedicated_first"  # a name from policies.registry
    # share of stickiness keys eligible for dedicated
    canary_percent: Annotated[float, Field(ge=0, le=100)] = 100.0
    # the `model` an answer names: the client's, or the upstream's
    response_model: ResponseModel = ResponseModel.REQUESTED
    slo: SloConfig = SloConfig()
    routing: RoutingConfig = RoutingConfig()  # the spill order, queueing, admission and batch priority
    breaker: BreakerConfig = BreakerConfig()
    retry: RetryConfig = RetryConfig()
    success: SuccessConfig = SuccessConfig()
    canary: CanaryControllerConfig | None = None  # the canary controller; none: set by hand only
    hedge: HedgeConfig | None = None  # none: a slow first token is waited for, never hedged
    parity: ParityConfig = ParityConfig()
    shadow: ShadowConfig | None = None  # none: no live request is mirrored
    dedicated: tuple[DedicatedEndpoint, ...] = ()  # dedicated endpoints, tried first
    serverless: tuple[ServerlessEndpoint, ...] = ()  # in preference order

    @model_validator(mode="after")
    def _hedge_needs_both_kinds(self) -> ModelConfig:
        if self.hedge is not None and not (self.dedicated and self.serverless):
            raise ValueError("hedge needs both a dedicated and a serverless endpoint to race")
        return self

    @model_validator(mode="after")
    def _shadow_target_known(self) -> ModelConfig:
        shadow = self.shadow
        names = {e.name for e in self.endpoints}
        if shadow is not None and shadow.endpoint is not None and shadow.endpoint not in names:
            raise ValueError(f"shadow.endpoint {shadow.endpoint!r} is not an endpoint of this model")
        if shadow is not None and shadow.candidate is not None and shadow.candidate.name in names:
            raise ValueError(f"shadow.candidate's name {shadow.candidate.name!r} is taken by an endpoint")
        return self

    def shadow_target(self) -> Endpoint | None:
        """The endpoint the model's shadow traffic goes to, if any."""
        if self.shadow is None:
            return None
        if self.shadow.candidate is not None:
            return self.shadow.candidate
        return next(e for e in self.endpoints if e.name == self.shadow.endpoint)

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return (*self.dedicated, *self.serverless)
