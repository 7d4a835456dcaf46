"""An endpoint's section: where it is, how long it may take, and, dedicated, its capacity and
price; serverless, its prices and keep-warm."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from policies.types import EndpointKind
from router.config.frozen import Frozen


class TimeoutsConfig(Frozen):
    """Per-endpoint timeouts in seconds."""

    connect_s: Annotated[float, Field(gt=0)] = 5.0  # a TCP (and TLS) connect to the upstream
    ttft_s: Annotated[float, Field(gt=0)] = 60.0  # request sent -> first byte from upstream
    idle_s: Annotated[float, Field(gt=0)] = 60.0  # longest gap between two chunks
    total_s: Annotated[float, Field(gt=0)] = 600.0  # the whole answer


class EngineSignalConfig(Frozen):
    """Poll a dedicated endpoint's vLLM `/metrics` and spill before its queue builds."""

    metrics_url: Annotated[str, Field(pattern=r"^https?://")]  # the engine's Prometheus /metrics (vLLM)
    max_running: Annotated[int, Field(gt=0)] | None = None  # engine's max_num_seqs; None: max_concurrency
    interval_s: Annotated[float, Field(gt=0)] = 1.0  # scrape period
    stale_after_s: Annotated[float, Field(gt=0)] = 5.0  # an older sample is not trusted ...
    # ... then decide by the leases alone, or spill
    on_stale: Literal["spill", "trust_leases"] = "trust_leases"
    waiting_on: Annotated[float, Field(ge=0)] = 1.0  # estimated waiting requests to start spilling
    waiting_off: Annotated[float, Field(ge=0)] = 0.0  # ... and to stop
    kv_cache_on: Annotated[float, Field(gt=0, le=1)] = 0.95  # KV cache usage fraction
    # ... until KV cache usage is back at or under this
    kv_cache_off: Annotated[float, Field(gt=0, le=1)] = 0.85
    dwell_s: Annotated[float, Field(ge=0)] = 2.0  # no change of verdict within this long of the last

    @model_validator(mode="after")
    def _off_below_on(self) -> EngineSignalConfig:
        if self.waiting_off > self.waiting_on or self.kv_cache_off > self.kv_cache_on:
            raise ValueError("each *_off threshold must be at or below its *_on threshold")
        return self


class EndpointConfig(Frozen):
    # unique within the model; letters, digits, _.:-
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")]
    # the API root the request paths are appended to (.../v1)
    base_url: Annotated[str, Field(pattern=r"^https?://")]
    model: Annotated[str, Field(min_length=1)]  # the upstream's id for this model
    api_key: str = ""  # sent as Authorization: Bearer (empty: none sent)
    organization: str = ""  # sent as OpenAI-Organization (a client's own is never forwarded)
    project: str = ""  # sent as OpenAI-Project
    timeouts: TimeoutsConfig = TimeoutsConfig()

    @field_validator("base_url")
    @classmethod
    def _api_root(cls, value: str) -> str:
        return api_root(value)


def api_root(value: str) -> str:
    """The OpenAI-style API root the request paths are appended to (`.../v1`): a bare host
    would send `/chat/completions` to the server's root, and a full operation URL would
    send `/chat/completions/chat/completions`; both fail only at the first request."""
    parts = urlsplit(value)
    if not parts.hostname:
        raise ValueError("no host: expected an API root such as https://api.example.com/v1")
    if parts.query or parts.fragment:
        raise ValueError("an API root has no query or fragment")
    path = parts.path.rstrip("/")
    if not path:
        raise ValueError(
            "no API path: the request paths are appended to it, so give the root the provider "
            "documents (e.g. https://api.example.com/v1, or http://vllm:8000/v1)"
        )
    for operation in ("/chat/completions", "/completions", "/embeddings"):
        if path.endswith(operation):
            raise ValueError(f"ends with {operation}: give the API root without the operation")
    return value


# A route's price has no default: a route left unpriced would cost $0 in every report and make
# the headline figure (cost per successful task) call it free. An explicit 0 is allowed.
PRICE_FIELDS = frozenset({"gpu_hour_usd", "usd_per_mtok_in", "usd_per_mtok_out"})


_CLOCK = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")


WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]


class ScheduleEntry(Frozen):
    """Replicas in force from `start` to `end` ("HH:MM" UTC; end before start: across
    midnight) on each of `days` (the day the window starts; none: every day), for pricing
    scale-to-zero, a bigger daytime pool or a weekday/weekend schedule (`tidegate plan
    --schedule` writes one)."""

    start: str  # HH:MM, UTC
    end: str  # HH:MM, UTC; may cross midnight
    replicas: Annotated[float, Field(ge=0)]  # the replica count priced while this window is in force
    days: tuple[Weekday, ...] = ()  # the days it starts on (mon..sun); empty: every day

    def minutes_of_week(self) -> set[int]:
        """The minutes of the week (0: Monday 00:00 UTC) the window covers."""
        start, end = self.seconds(self.start) // 60, self.seconds(self.end) // 60
        length = end - start if end > start else end + 1440 - start
        days = [WEEKDAYS.index(d) for d in self.days] if self.days else range(7)
        return {(day * 1440 + start + m) % 10080 for day in days for m in range(length)}

    @field_validator("start", "end")
    @classmethod
    def _clock(cls, value: str) -> str:
        if not _CLOCK.fullmatch(value):
            raise ValueError("expected a UTC time of day as HH:MM")
        return value

    @field_validator("days")
    @classmethod
    def _days_once(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError("a day is named twice")
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
    # this endpoint's slots, global across gateway replicas; with replica_urls, each replica's
    max_concurrency: Annotated[int, Field(gt=0)]
    # a pool of replicas in one entry: their API roots (leave base_url out); loaded as one
    # dedicated endpoint per URL, named NAME-0, NAME-1, ... (router/config/pools.py)
    replica_urls: tuple[Annotated[str, Field(pattern=r"^https?://")], ...] = ()
    # a pool found by DNS: its API root, with a name whose A/AAAA records are the replicas (a
    # Kubernetes headless Service), re-read every discovery.refresh_s; leave base_url out
    replica_dns: Annotated[str, Field(pattern=r"^https?://")] | None = None
    # with replica_dns: the most replicas at once (KEDA's maxReplicaCount); slots NAME-0, NAME-1, ...
    max_replicas: Annotated[int, Field(gt=0, le=256)] | None = None
    max_waiters: Annotated[int, Field(ge=0)] = 64  # requests waiting in line (routing.max_queue_ms)
    engine_signal: EngineSignalConfig | None = None
    # per GPU: the endpoint costs gpus x this x replicas; required (PRICE_FIELDS), 0 when paid elsewhere
    gpu_hour_usd: Annotated[float, Field(ge=0)]
    gpus: Annotated[int, Field(gt=0)] = 1  # per replica
    # provisioned outside the schedule's windows; max_concurrency is the slots at this count
    # (one replica's when 0), so a schedule scales the slots with the replicas (router/economics/costs.py)
    replicas: Annotated[float, Field(ge=0)] = 1.0
    schedule: tuple[ScheduleEntry, ...] = ()  # other replica counts at fixed times of day (UTC)
    # predicted-TTFT admission's prior for this pool, until its TTFTs are measured: TTFT =
    # overhead + prompt tokens waiting for prefill / rate (router/signals/prefill.py learns both)
    prefill_tokens_per_s: Annotated[float, Field(gt=0)] = 8000.0
    # the fixed part of a predicted TTFT (the prior until TTFTs are measured)
    ttft_overhead_ms: Annotated[float, Field(ge=0)] = 50.0

    @model_validator(mode="before")
    @classmethod
    def _pool_or_one(cls, data: Any) -> Any:
        """A pool's entry names its replicas' URLs, not one base_url (the first replica's
        stands in for it, so every endpoint has one); its replica count is its URLs'."""
        if not isinstance(data, dict):
            return data
        if data.get("replica_dns"):
            return _found_by_dns(data)
        if "max_replicas" in data:
            raise ValueError("max_replicas bounds a pool found by DNS: set replica_dns, or leave it out")
        if not data.get("replica_urls"):
            return data
        given = [key for key in ("base_url", "replicas", "schedule") if key in data]
        if given:
            raise ValueError(
                f"replica_urls lists the pool's replicas: leave {' and '.join(given)} out "
                "(each URL is one replica, priced and given max_concurrency slots of its own)"
            )
        urls = data["replica_urls"]
        if not isinstance(urls, list | tuple):
            return data  # not a list: its own field's check says so
        return {**data, "base_url": urls[0]}

    @field_validator("replica_dns")
    @classmethod
    def _dns_root(cls, value: str | None) -> str | None:
        return None if value is None else api_root(value)

    @field_validator("replica_urls")
    @classmethod
    def _replica_roots(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            api_root(url)
        if len(set(value)) != len(value):
            raise ValueError("a replica URL is listed twice")
        return value

    @model_validator(mode="after")
    def _schedule_windows_apart(self) -> DedicatedEndpoint:
        taken: set[int] = set()
        for entry in self.schedule:
            minutes = entry.minutes_of_week()
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


def _found_by_dns(data: dict[str, Any]) -> dict[str, Any]:
    """A DNS pool's replicas are the name's records: not listed and not scheduled here (an
    engine_signal's metrics_url gives the path; each pod is scraped at its own address)."""
    listed = ("base_url", "replica_urls", "replicas", "schedule")
    given = [key for key in listed if key in data]
    if given:
        raise ValueError(
            f"replica_dns finds the pool's replicas: leave {' and '.join(given)} out "
            "(each pod it resolves is one replica)"
        )
    if "max_replicas" not in data:
        raise ValueError(
            "replica_dns needs max_replicas: the most replicas at once, each given max_concurrency slots"
        )
    return {**data, "base_url": data["replica_dns"]}


class KeepWarmConfig(Frozen):
    """Keep a scale-to-zero serverless route warm: one `max_tokens: 1` request every
    `interval_s` (set it under the provider's idle timeout), sent by exactly one gateway
    replica, while `when` holds, up to `max_usd_per_day` (router/spill/keep_warm.py). With `learn`,
    a ping that finds the route cold after an idle gap shrinks the interval to half that gap
    (not under `min_interval_s`)."""

    interval_s: Annotated[float, Field(gt=0, le=3600)]  # one `max_tokens: 1` request this often
    # always; dedicated_busy: only while the model's dedicated slots in use are at least
    # `busy_above` of its slots (a spill is plausible); schedule: in the UTC hours of the day in
    # which the model spilled at least `schedule_min_spills` a day over the last `schedule_days`
    when: Literal["always", "dedicated_busy", "schedule"] = "always"
    # `dedicated_busy`: ping only while this share of the slots is in use
    busy_above: Annotated[float, Field(gt=0, le=1)] = 0.6
    # `schedule`: the days of spills it learns the hours from
    schedule_days: Annotated[int, Field(ge=1, le=30)] = 1
    # `schedule`: an hour with at least this many spills a day is kept warm
    schedule_min_spills: Annotated[float, Field(gt=0)] = 1.0
    max_usd_per_day: Annotated[float, Field(ge=0)] = 1.0  # the pings stop for the UTC day past it
    prompt_tokens: Annotated[int, Field(ge=1, le=1000)] = 8  # priced as this many input tokens
    learn: bool = False  # shrink interval_s on cold-start evidence
    # `learn`: the interval is never shortened under this
    min_interval_s: Annotated[float, Field(gt=0, le=3600)] = 5.0
    # a ping slower than this found the route cold; none: 4 x the median of its last 20 pings
    # (at least 1 s)
    cold_ms: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _min_under_interval(self) -> KeepWarmConfig:
        if self.learn and self.min_interval_s > self.interval_s:
            raise ValueError("min_interval_s must not exceed interval_s")
        return self


class ServerlessEndpoint(EndpointConfig):
    usd_per_mtok_in: Annotated[float, Field(ge=0)]  # required (PRICE_FIELDS)
    usd_per_mtok_out: Annotated[float, Field(ge=0)]  # required: the price of a million output tokens
    keep_warm: KeepWarmConfig | None = None

    @property
    def kind(self) -> EndpointKind:
        return EndpointKind.SERVERLESS

    @property
    def max_concurrency(self) -> None:
        """Serverless has no slots of ours (policies.types.Target)."""
        return None


Endpoint = DedicatedEndpoint | ServerlessEndpoint
