"""Typed, frozen gateway configuration loaded from YAML plus the environment.

The file format is the canonical example in DESIGN.md (see `examples/tidegate.yaml`).
Strings may reference the environment: `${VAR}` (an error at load time if unset) and
`${VAR:-default}` (falls back to `default`). Validation happens once, at start, and every
problem is reported with its key path (`models.m.dedicated[0].max_concurrency`), what was
expected and what was found, so `tidegate check-config` can print them all at once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from policies.predicted_ttft import Admission
from policies.serverless import ServerlessOrder
from policies.types import EndpointKind, route_key

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(Exception):
    """The configuration cannot be used; `problems` lists each one as `path: message`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration:\n" + "\n".join(f"  {p}" for p in problems))
        self.problems = problems


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ListenConfig(_Frozen):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8000


class ServerConfig(_Frozen):
    """The HTTP server. `forwarded_allow_ips`: the proxies (IPs, CIDRs, or "*") whose
    X-Forwarded-For and X-Forwarded-Proto are believed; empty, nobody's are (the client's
    address is the socket's)."""

    forwarded_allow_ips: tuple[str, ...] = ()


class StateConfig(_Frozen):
    redis_url: str = ""  # empty: the embedded in-memory store (one process only)
    lease_ttl_s: Annotated[float, Field(gt=0)] = 30.0  # a dead replica's slots free up after this
    window_s: Annotated[float, Field(ge=10, le=3600)] = 60.0  # latency window policies read
    retention_s: Annotated[float, Field(ge=60)] = 86400.0  # latency slices expire after this
    # per-route histograms and counters in the store; false leaves the SLO guard, `fastest`,
    # the wait-in-line estimate and /admin/routes without data (kept for measuring their cost)
    record: bool = True
    fallback_share: Annotated[float, Field(gt=0, le=1)] = 0.5  # of each pool per process while Redis is down
    # Redis unreachable at start: refuse to start (false), or start deciding locally (true)
    start_degraded: bool = False
    redis_cluster: bool = False  # redis_url points at a Redis Cluster (also: a redis+cluster:// URL)
    leader_ttl_s: Annotated[float, Field(ge=1, le=300)] = 10.0  # the canary controller's leader lease


class AuthConfig(_Frozen):
    """Client keys that all resolve empty refuse to start, unless `allow_anonymous` says to
    run open: a missing secret must never silently open the gateway."""

    api_keys: tuple[str, ...] = ()  # empty strings are dropped
    allow_anonymous: bool = False
    admin_key: str = ""  # empty: the admin API answers 403

    @field_validator("api_keys")
    @classmethod
    def _drop_empty(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(k for k in keys if k)

    @model_validator(mode="after")
    def _closed_unless_said(self) -> AuthConfig:
        if not self.api_keys and not self.allow_anonymous:
            raise ValueError(
                "no client API key is set (every auth.api_keys entry is empty or missing); set one, "
                "or set auth.allow_anonymous: true to serve without keys"
            )
        if self.api_keys and self.allow_anonymous:
            raise ValueError("auth.allow_anonymous: true and auth.api_keys both set; choose one")
        if self.admin_key and self.admin_key in self.api_keys:
            raise ValueError("auth.admin_key must differ from every client key in auth.api_keys")
        return self


class LimitsConfig(_Frozen):
    """Every resource a client or an upstream can grow, bounded per process. README,
    "Security and limits", says what the client gets when each is hit."""

    max_body_bytes: Annotated[int, Field(gt=0)] = 4 * 1024 * 1024  # proxied /v1 paths: 413 above
    # the admin API, feedback and every other path: 413 above (checked before auth)
    max_control_body_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024
    # bodies held by the requests in flight of one process; a head that does not fit: 503
    max_body_bytes_in_flight: Annotated[int, Field(gt=0)] = 256 * 1024 * 1024
    # after a refusal (or an answer before the body ended), the rest of the body is read and
    # dropped for at most this long and this many bytes, then the connection closes
    discard_timeout_s: Annotated[float, Field(gt=0, le=600)] = 5.0
    max_discard_bytes: Annotated[int, Field(ge=0)] = 64 * 1024 * 1024
    max_output_tokens: Annotated[int, Field(gt=0)] = 1 << 20  # a larger max_tokens is refused (400)
    max_n: Annotated[int, Field(ge=1, le=128)] = 8  # `n` / `best_of` above: 400
    drain_s: Annotated[int, Field(ge=1)] = 30  # on SIGTERM, in-flight requests get this long (s)
    max_in_flight: Annotated[int, Field(ge=1)] = 1024  # /v1 requests at once; more: 503 + Retry-After
    max_connections: Annotated[int, Field(ge=1)] = 4096  # open client connections; more are closed
    max_header_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024  # request line + headers; more: 431
    header_timeout_s: Annotated[float, Field(gt=0)] = 10.0  # connect/idle -> end of headers; else 408
    body_timeout_s: Annotated[float, Field(gt=0)] = 60.0  # headers -> end of body; else 408
    keep_alive_s: Annotated[float, Field(gt=0)] = 90.0  # idle keep-alive; above clients' and LBs' own
    request_timeout_s: Annotated[float, Field(gt=0)] = 600.0  # the whole request, retries included: 504
    client_write_timeout_s: Annotated[float, Field(gt=0)] = 30.0  # a client not reading this long: cut
    max_response_bytes: Annotated[int, Field(gt=0)] = 64 * 1024 * 1024  # an upstream body above: 502
    max_event_bytes: Annotated[int, Field(gt=0)] = 8 * 1024 * 1024  # one upstream SSE event above: cut

    @model_validator(mode="after")
    def _one_body_fits(self) -> LimitsConfig:
        if self.max_body_bytes > self.max_body_bytes_in_flight:
            raise ValueError(
                "max_body_bytes must not exceed max_body_bytes_in_flight (no such body could be read)"
            )
        return self

    def worst_case_bytes(self) -> int:
        """What clients can make one process hold at most: every body in flight, plus the
        request head of every open connection (a body nobody reads is dropped, not kept)."""
        return self.max_body_bytes_in_flight + self.max_connections * self.max_header_bytes


class TimeoutsConfig(_Frozen):
    """Per-endpoint timeouts in seconds."""

    connect_s: Annotated[float, Field(gt=0)] = 5.0
    ttft_s: Annotated[float, Field(gt=0)] = 60.0  # request sent -> first byte from upstream
    idle_s: Annotated[float, Field(gt=0)] = 60.0  # longest gap between two chunks
    total_s: Annotated[float, Field(gt=0)] = 600.0


class EngineSignalConfig(_Frozen):
    """Poll a dedicated endpoint's vLLM `/metrics` and spill before its queue builds."""

    metrics_url: Annotated[str, Field(pattern=r"^https?://")]
    max_running: Annotated[int, Field(gt=0)] | None = None  # engine's max_num_seqs; None: max_concurrency
    interval_s: Annotated[float, Field(gt=0)] = 1.0
    stale_after_s: Annotated[float, Field(gt=0)] = 5.0
    on_stale: Literal["spill", "trust_leases"] = "trust_leases"
    waiting_on: Annotated[float, Field(ge=0)] = 1.0  # estimated waiting requests to start spilling
    waiting_off: Annotated[float, Field(ge=0)] = 0.0  # ... and to stop
    kv_cache_on: Annotated[float, Field(gt=0, le=1)] = 0.95  # KV cache usage fraction
    kv_cache_off: Annotated[float, Field(gt=0, le=1)] = 0.85
    dwell_s: Annotated[float, Field(ge=0)] = 2.0

    @model_validator(mode="after")
    def _off_below_on(self) -> EngineSignalConfig:
        if self.waiting_off > self.waiting_on or self.kv_cache_off > self.kv_cache_on:
            raise ValueError("each *_off threshold must be at or below its *_on threshold")
        return self


class EndpointConfig(_Frozen):
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")]
    base_url: Annotated[str, Field(pattern=r"^https?://")]
    model: Annotated[str, Field(min_length=1)]  # the upstream's id for this model
    api_key: str = ""
    organization: str = ""  # sent as OpenAI-Organization (a client's own is never forwarded)
    project: str = ""  # sent as OpenAI-Project
    timeouts: TimeoutsConfig = TimeoutsConfig()


_CLOCK = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")


class ScheduleEntry(_Frozen):
    """Replicas in force every day (UTC) from `start` to `end` ("HH:MM"; end before start:
    across midnight), for pricing scale-to-zero or a bigger daytime pool."""

    start: str
    end: str
    replicas: Annotated[float, Field(ge=0)]

    @field_validator("start", "end")
    @classmethod
    def _clock(cls, value: str) -> str:
        if not _CLOCK.fullmatch(value):
            raise ValueError("expected a UTC time of day as HH:MM")
        return value

    def seconds(self, value: str) -> int:
        hours, minutes = value.split(":")
        return int(hours) * 3600 + int(minutes) * 60

    @model_validator(mode="after")
    def _not_empty(self) -> ScheduleEntry:
        if self.start == self.end:
            raise ValueError("start and end are the same time: the window would be empty")
        return self


class DedicatedEndpoint(EndpointConfig):
    max_concurrency: Annotated[int, Field(gt=0)]  # global across all replicas
    max_waiters: Annotated[int, Field(ge=0)] = 64  # requests waiting in line (routing.max_queue_ms)
    engine_signal: EngineSignalConfig | None = None
    gpu_hour_usd: Annotated[float, Field(ge=0)] = 0.0  # per GPU: the endpoint costs gpus x this x replicas
    gpus: Annotated[int, Field(gt=0)] = 1  # per replica
    # provisioned outside the schedule's windows; max_concurrency is the slots at this count
    # (one replica's when 0), so a schedule scales the slots with the replicas (router/economics/costs.py)
    replicas: Annotated[float, Field(ge=0)] = 1.0
    schedule: tuple[ScheduleEntry, ...] = ()  # other replica counts at fixed times of day (UTC)
    # predicted-TTFT admission's prior for this pool, until its TTFTs are measured: TTFT =
    # overhead + prompt tokens waiting for prefill / rate (router/signals/prefill.py learns both)
    prefill_tokens_per_s: Annotated[float, Field(gt=0)] = 8000.0
    ttft_overhead_ms: Annotated[float, Field(ge=0)] = 50.0

    @model_validator(mode="after")
    def _schedule_windows_apart(self) -> DedicatedEndpoint:
        taken: set[int] = set()
        for entry in self.schedule:
            start, end = entry.seconds(entry.start) // 60, entry.seconds(entry.end) // 60
            minutes = set(range(start, end)) if end > start else set(range(start, 1440)) | set(range(end))
            if taken & minutes:
                raise ValueError(
                    f"schedule windows overlap (at {entry.start}-{entry.end}); each minute needs one count"
                )
            taken |= minutes
        return self

    @property
    def usd_per_hour(self) -> float:
        """The provisioned price per hour at the base replica count."""
        return self.gpus * self.gpu_hour_usd * self.replicas

    @property
    def kind(self) -> EndpointKind:
        return EndpointKind.DEDICATED


class KeepWarmConfig(_Frozen):
    """Keep a scale-to-zero serverless route warm: one `max_tokens: 1` request every
    `interval_s` (set it under the provider's idle timeout), sent by exactly one gateway
    replica, while `when` holds, up to `max_usd_per_day` (router/spill/keep_warm.py). With `learn`,
    a probe that finds the route cold after an idle gap shrinks the interval to half that gap
    (not under `min_interval_s`)."""

    interval_s: Annotated[float, Field(gt=0, le=3600)]
    # always; dedicated_busy: only while the model's dedicated slots in use are at least
    # `busy_above` of its slots (a spill is plausible); schedule: in the UTC hours of the day in
    # which the model spilled at least `schedule_min_spills` a day over the last `schedule_days`
    when: Literal["always", "dedicated_busy", "schedule"] = "always"
    busy_above: Annotated[float, Field(gt=0, le=1)] = 0.6
    schedule_days: Annotated[int, Field(ge=1, le=30)] = 1
    schedule_min_spills: Annotated[float, Field(gt=0)] = 1.0
    max_usd_per_day: Annotated[float, Field(ge=0)] = 1.0  # the probes stop for the UTC day past it
    prompt_tokens: Annotated[int, Field(ge=1, le=1000)] = 8  # priced as this many input tokens
    learn: bool = False  # shrink interval_s on cold-start evidence
    min_interval_s: Annotated[float, Field(gt=0, le=3600)] = 5.0
    # a probe slower than this found the route cold; none: 4 x the median of its last 20 probes
    # (at least 1 s)
    cold_ms: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _min_under_interval(self) -> KeepWarmConfig:
        if self.learn and self.min_interval_s > self.interval_s:
            raise ValueError("min_interval_s must not exceed interval_s")
        return self


class ServerlessEndpoint(EndpointConfig):
    usd_per_mtok_in: Annotated[float, Field(ge=0)] = 0.0
    usd_per_mtok_out: Annotated[float, Field(ge=0)] = 0.0
    keep_warm: KeepWarmConfig | None = None

    @property
    def kind(self) -> EndpointKind:
        return EndpointKind.SERVERLESS

    @property
    def max_concurrency(self) -> None:
        """Serverless has no slots of ours (policies.types.Target)."""
        return None


Endpoint = DedicatedEndpoint | ServerlessEndpoint


class SloConfig(_Frozen):
    """The SLO guard: spill new requests off a dedicated route whose windowed p95 TTFT is over
    `ttft_p95_ms`; go back once it is at or under `recover_ratio` x that (or the window holds
    fewer than `min_samples`), never changing state within `dwell_s` of the last change."""

    ttft_p95_ms: Annotated[float, Field(gt=0)] | None = None  # None: no SLO guard
    # predicted-TTFT admission admits to dedicated while the prediction fits this (ms);
    # None: the SLO's p95 target
    ttft_budget_ms: Annotated[float, Field(gt=0)] | None = None
    recover_ratio: Annotated[float, Field(gt=0, le=1)] = 0.8
    min_samples: Annotated[int, Field(ge=1)] = 20
    dwell_s: Annotated[float, Field(ge=0)] = 10.0

    @property
    def admission_budget_ms(self) -> float | None:
        return self.ttft_budget_ms if self.ttft_budget_ms is not None else self.ttft_p95_ms


class ResponseModel(StrEnum):
    REQUESTED = "requested"  # answers name the model the client asked for
    UPSTREAM = "upstream"  # answers keep the upstream's id (it is also in x-tidegate-upstream-model)


class RoutingConfig(_Frozen):
    serverless: ServerlessOrder = ServerlessOrder.CONFIGURED
    min_samples: Annotated[int, Field(ge=1)] = 20  # before `fastest` trusts a route's figures
    explore_percent: Annotated[float, Field(ge=0, le=100)] = 5.0  # keys sent to unmeasured routes
    max_queue_ms: Annotated[float, Field(ge=0, le=10_000)] = 0.0  # wait for a dedicated slot; 0: spill
    admission: Admission = Admission.SLOTS  # or predicted_ttft (policies/predicted_ttft.py)


class RetryConfig(_Frozen):
    """Attempts after the first are retries; within `budget_window_s` a process makes at most
    `budget_percent` of the model's requests in retries (and always allows `min_retries`)."""

    attempts: Annotated[int, Field(ge=1, le=10)] = 3
    backoff_ms: Annotated[float, Field(ge=0)] = 100.0
    budget_percent: Annotated[float, Field(ge=0, le=100)] = 20.0
    budget_window_s: Annotated[float, Field(gt=0)] = 10.0
    min_retries: Annotated[int, Field(ge=0)] = 3  # per window, so a quiet model can still retry


class BreakerConfig(_Frozen):
    """Per endpoint: open after `consecutive_failures` failed attempts in a row, or when at
    least `min_requests` attempts in `window_s` failed at `error_rate_percent` or more. Open
    means skipped (`circuit_open`) for a cooldown of `cooldown_s`, doubled on each failed
    probe up to `max_cooldown_s`; after it the next requests probe the endpoint and a success
    closes it. Shared through the state store."""

    consecutive_failures: Annotated[int, Field(ge=1)] = 5
    error_rate_percent: Annotated[float, Field(gt=0, le=100)] = 50.0
    min_requests: Annotated[int, Field(ge=1)] = 20
    window_s: Annotated[float, Field(gt=0)] = 10.0
    cooldown_s: Annotated[float, Field(gt=0)] = 5.0
    max_cooldown_s: Annotated[float, Field(gt=0)] = 60.0


class SuccessConfig(_Frozen):
    """The automatic checks that decide a served answer succeeded (before any application
    feedback): its finish_reason is accepted, its tool-call arguments parse as JSON, and a
    `response_format` json_object/json_schema answer parses (and matches its schema)."""

    finish_reasons: tuple[str, ...] = ("stop", "tool_calls")  # `length` is a failure unless listed
    check_json: bool = True  # tool-call arguments and JSON answers must parse
    max_checked_bytes: Annotated[int, Field(gt=0)] = 1024 * 1024  # of a stream's text kept for checks


class CanaryChecks(_Frozen):
    """Dedicated against serverless over the same interval; a check whose figure is missing on
    a side (no samples) makes the analysis inconclusive, not failed."""

    ttft_p95_max_ratio: Annotated[float, Field(gt=0)] | None = 1.2
    ttft_p95_max_ms: Annotated[float, Field(gt=0)] | None = None
    itl_p50_max_ratio: Annotated[float, Field(gt=0)] | None = 1.5
    error_rate_max_percent: Annotated[float, Field(ge=0, le=100)] | None = 1.0  # dedicated, absolute
    success_rate_min_ratio: Annotated[float, Field(gt=0)] | None = 0.98  # dedicated / serverless
    cost_per_success_max_ratio: Annotated[float, Field(gt=0)] | None = None  # dedicated / serverless


class CanaryControllerConfig(_Frozen):
    """Move the model's canary percent step by step while dedicated holds up against
    serverless (router/canary/controller.py)."""

    steps: tuple[Annotated[float, Field(gt=0, le=100)], ...] = ()
    step_percent: Annotated[float, Field(gt=0, le=100)] | None = None  # instead of steps: +this ...
    max_percent: Annotated[float, Field(gt=0, le=100)] = 100.0  # ... up to this
    interval_s: Annotated[float, Field(gt=0)] = 300.0
    min_samples: Annotated[int, Field(ge=1)] = 75  # requests per side and interval; fewer: hold
    # no caller (API key) weighs more than this share of a side's success and error rates
    max_caller_share: Annotated[float, Field(gt=0, le=1)] = 0.5
    min_callers: Annotated[int, Field(ge=1)] = 3  # fewer: the verdict says it rests on few callers
    checks: CanaryChecks = CanaryChecks()
    failure_threshold: Annotated[int, Field(ge=1)] = 2  # failed analyses in a row before on_failure
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


class HedgeConfig(_Frozen):
    """A stream whose dedicated attempt has no first event `after_ms` after it was sent also
    starts its serverless attempt; the first of the two to produce a first event is relayed,
    the other cancelled at once (its slot released). At most `max_percent` of the model's
    requests hedge within `window_s` (per process), and always `min_hedges` (so the first
    stall after a quiet spell is hedged too); non-stream requests never hedge (their first
    byte is the whole answer). See router/request/hedge.py."""

    after_ms: Annotated[float, Field(gt=0, le=600_000)]
    max_percent: Annotated[float, Field(gt=0, le=100)] = 5.0
    window_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    min_hedges: Annotated[int, Field(ge=0, le=1000)] = 1  # per window, whatever the share


class ModelConfig(_Frozen):
    policy: str = "dedicated_first"  # a name from policies.registry
    canary_percent: Annotated[float, Field(ge=0, le=100)] = 100.0
    response_model: ResponseModel = ResponseModel.REQUESTED
    slo: SloConfig = SloConfig()
    routing: RoutingConfig = RoutingConfig()
    breaker: BreakerConfig = BreakerConfig()
    retry: RetryConfig = RetryConfig()
    success: SuccessConfig = SuccessConfig()
    canary: CanaryControllerConfig | None = None  # the canary controller; none: set by hand only
    hedge: HedgeConfig | None = None  # none: a slow first token is waited for, never hedged
    dedicated: tuple[DedicatedEndpoint, ...] = ()
    serverless: tuple[ServerlessEndpoint, ...] = ()  # in preference order

    @model_validator(mode="after")
    def _hedge_needs_both_kinds(self) -> ModelConfig:
        if self.hedge is not None and not (self.dedicated and self.serverless):
            raise ValueError("hedge needs both a dedicated and a serverless endpoint to race")
        return self

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return (*self.dedicated, *self.serverless)


class TasksConfig(_Frozen):
    """Tasks (requests grouped by `x-tidegate-task-id`, or one request each) are tracked this
    long for feedback (`POST /v1/feedback`), at most `max_tracked` per process (memory store;
    Redis keeps them by TTL alone)."""

    ttl_s: Annotated[float, Field(ge=60, le=7 * 86400)] = 3600.0
    max_tracked: Annotated[int, Field(ge=1000)] = 200_000
    # failure feedback on a request or task not settled yet is kept this long, at most this
    # many per key (past that: 429); it never displaces a tracked task
    early_feedback_s: Annotated[float, Field(ge=1, le=3600)] = 60.0
    max_early_feedback: Annotated[int, Field(ge=1, le=100_000)] = 100


class GatewayConfig(_Frozen):
    # a time-lapse for replays: the time constants were divided by this (router/offline/timelapse.py)
    time_scale: Annotated[float, Field(ge=1, le=1000)] = 1.0
    listen: ListenConfig = ListenConfig()
    server: ServerConfig = ServerConfig()
    tasks: TasksConfig = TasksConfig()
    state: StateConfig = StateConfig()
    # validated like a written one: a config with no `auth` at all refuses to start, too
    auth: AuthConfig = Field(default_factory=dict, validate_default=True)
    limits: LimitsConfig = LimitsConfig()
    models: Mapping[str, ModelConfig]

    @field_validator("models")
    @classmethod
    def _at_least_one(cls, models: Mapping[str, ModelConfig]) -> Mapping[str, ModelConfig]:
        if not models:
            raise ValueError("at least one model must be configured")
        return models

    @model_validator(mode="after")
    def _schedules_have_history(self) -> GatewayConfig:
        """A keep-warm schedule reads the model's hourly spills from the shared store."""
        for name, model in self.models.items():
            for e in model.serverless:
                warm = e.keep_warm
                if warm is None or warm.when != "schedule":
                    continue
                key = f"models.{name}.serverless[{e.name}].keep_warm"
                if not self.state.redis_url:
                    raise ValueError(
                        f"{key}.when: schedule needs state.redis_url "
                        "(the in-memory store keeps an hour of history)"
                    )
                if warm.schedule_days * 86400 > self.state.retention_s:
                    raise ValueError(
                        f"{key}.schedule_days: {warm.schedule_days} days is longer than "
                        f"state.retention_s keeps ({self.state.retention_s:g} s)"
                    )
        return self

    def route_keys(self) -> list[str]:
        """Every route (model, endpoint) the config defines, as the stores and reports name it."""
        return [route_key(name, e.name) for name, model in self.models.items() for e in model.endpoints]


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read, substitute and validate a config file; raise ConfigError with every problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from exc
    return parse_config(text, env if env is not None else os.environ)


def parse_config(text: str, env: Mapping[str, str]) -> GatewayConfig:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"not valid YAML: {exc}"]) from exc
    if not isinstance(raw, dict):
        raise ConfigError([f"top level: expected a mapping, found {type(raw).__name__}"])
    problems: list[str] = []
    resolved = _substitute(raw, env, "", problems)
    if problems:
        raise ConfigError(problems)
    try:
        config = GatewayConfig.model_validate(resolved)
    except ValidationError as exc:
        raise ConfigError([_describe(err) for err in exc.errors()]) from exc
    _check_endpoints(config)
    return config


def _substitute(node: Any, env: Mapping[str, str], path: str, problems: list[str]) -> Any:
    if isinstance(node, dict):
        return {k: _substitute(v, env, _join(path, str(k)), problems) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, env, f"{path}[{i}]", problems) for i, v in enumerate(node)]
    if isinstance(node, str):
        return _ENV_REF.sub(lambda m: _lookup(m, env, path, problems), node)
    return node


def _lookup(match: re.Match[str], env: Mapping[str, str], path: str, problems: list[str]) -> str:
    name, default = match.group(1), match.group(2)
    if name in env:
        return env[name]
    if default is not None:
        return default
    problems.append(f"{path}: environment variable {name} is not set (use ${{{name}:-}} for a default)")
    return ""


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _describe(err: Any) -> str:
    path = ""
    for part in err["loc"]:
        path = f"{path}[{part}]" if isinstance(part, int) else _join(path, str(part))
    found = err.get("input")
    if err["type"] == "missing":
        shown = "nothing"
    elif isinstance(found, dict):
        shown = "an empty mapping" if not found else "a mapping"
    else:
        shown = repr(found)
    message = str(err["msg"]).removeprefix("Value error, ")
    return f"{path or 'top level'}: {message} (found {shown})"


def _admission_problems(name: str, model: ModelConfig) -> list[str]:
    """Predicted-TTFT admission needs a budget, and replaces the wait in line (it decides
    once between the dedicated queue and spilling): a config with both is ambiguous."""
    if model.routing.admission is not Admission.PREDICTED_TTFT:
        return []
    problems = []
    if model.slo.admission_budget_ms is None:
        problems.append(
            f"models.{name}.slo.ttft_budget_ms: routing.admission predicted_ttft needs a TTFT budget "
            "(ttft_budget_ms, or ttft_p95_ms)"
        )
    if model.routing.max_queue_ms > 0:
        problems.append(
            f"models.{name}.routing.max_queue_ms: must be 0 with admission predicted_ttft, which decides "
            "once between the dedicated queue and spilling instead of waiting in line"
        )
    return problems


def _check_endpoints(config: GatewayConfig) -> None:
    """Endpoint names are unique in a model; a dedicated name shared by models is one pool."""
    problems: list[str] = []
    pools: dict[str, tuple[str, int]] = {}
    for model_name, model in config.models.items():
        seen: set[str] = set()
        if not model.endpoints:
            problems.append(f"models.{model_name}: needs at least one dedicated or serverless endpoint")
        if model.canary is not None and not (model.dedicated and model.serverless):
            problems.append(
                f"models.{model_name}.canary: the controller compares dedicated with serverless; "
                "the model needs at least one of each"
            )
        problems += _admission_problems(model_name, model)
        for endpoint in model.endpoints:
            if endpoint.name in seen:
                problems.append(f"models.{model_name}: endpoint name {endpoint.name!r} is used twice")
            seen.add(endpoint.name)
        for i, ded in enumerate(model.dedicated):
            pool = pools.setdefault(ded.name, (ded.base_url, ded.max_concurrency))
            if pool != (ded.base_url, ded.max_concurrency):
                problems.append(
                    f"models.{model_name}.dedicated[{i}]: {ded.name!r} is defined elsewhere with "
                    f"base_url/max_concurrency {pool}; a shared dedicated pool must match"
                )
    if problems:
        raise ConfigError(problems)
