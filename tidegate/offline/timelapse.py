"""A gateway config for a time-lapsed replay: every time constant that shapes routing divided
by the replay's speed, so the gateway sees the trace's minutes as the simulators (run with
`--time-scale` at the same speed) do. That includes the SLO's TTFT targets and the admission
budget (and the canary's TTFT check): the gateway measures TTFTs in wall time, K times shorter
at speed K, so a target left in trace time would be K times too loose. For the same reason the
prefill rate it learns is K times the trace's, and the dedicated priors are scaled alike (the
overhead divided, the rate multiplied), so a prediction is the trace's divided by K throughout.

`tidegate replay --scale-config tidegate.yaml --speed K` prints the scaled config. It is written
from the file as written (a `${VAR}` reference stays a reference, so no secret is copied out),
with the defaults the file left out made explicit and divided too, and `time_scale: K` set.
A constant that cannot go that low (the latency window's 10 s slices, a leader lease's 1 s) is
an error naming the key: that replay cannot be faithful at that speed, so it is refused. The
gateway reports its `time_scale` on /readyz; `tidegate replay --speed K` refuses a gateway
that was not scaled by K.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import BaseModel

from router.config import (
    BatchConfig,
    BreakerConfig,
    CanaryChecks,
    CanaryControllerConfig,
    DedicatedEndpoint,
    EngineSignalConfig,
    HedgeConfig,
    KeepWarmConfig,
    LimitsConfig,
    RetryConfig,
    RoutingConfig,
    ShadowConfig,
    SloConfig,
    StateConfig,
    TimeoutsConfig,
    parse_config,
)

# (section, its config class, the time constants in it that a time-lapse divides)
_Sections = tuple[tuple[str, type[BaseModel], tuple[str, ...]], ...]
_TOP: _Sections = (
    ("state", StateConfig, ("window_s", "lease_ttl_s", "leader_ttl_s")),
    ("limits", LimitsConfig, ("request_timeout_s",)),
)
_MODEL: _Sections = (
    ("routing", RoutingConfig, ("max_queue_ms",)),
    ("slo", SloConfig, ("dwell_s", "ttft_p95_ms", "ttft_budget_ms")),
    ("retry", RetryConfig, ("backoff_ms", "budget_window_s")),
    ("breaker", BreakerConfig, ("window_s", "cooldown_s", "max_cooldown_s")),
)
_ENDPOINT: _Sections = (("timeouts", TimeoutsConfig, ("ttft_s", "idle_s", "total_s")),)
_OPTIONAL_MODEL: _Sections = (
    ("canary", CanaryControllerConfig, ("interval_s",)),
    ("hedge", HedgeConfig, ("after_ms", "window_s")),
    ("shadow", ShadowConfig, ("timeout_s",)),
)
_BATCH: _Sections = (("batch", BatchConfig, ("max_wait_s",)),)  # inside routing
_CANARY_CHECKS: _Sections = (("checks", CanaryChecks, ("ttft_p95_max_ms",)),)
# a dedicated endpoint's predicted-TTFT priors: the overhead is a time, the prefill a rate
# (tokens per trace second are K times as many per wall second)
_DEDICATED_TIMES = ("ttft_overhead_ms",)
_DEDICATED_RATES = ("prefill_tokens_per_s",)
_OPTIONAL_ENDPOINT: _Sections = (
    ("engine_signal", EngineSignalConfig, ("interval_s", "stale_after_s", "dwell_s")),
    ("keep_warm", KeepWarmConfig, ("interval_s", "min_interval_s", "cold_ms")),
)
# a named key's limits are rates: K times as many requests and tokens per wall minute
_KEY_RATES = ("rpm", "tpm")

# The time and rate fields a time-lapse leaves alone, each with why: a test
# (tests/router/test_timelapse_declared.py) fails on a field that is in neither list.
UNSCALED: Mapping[str, str] = {
    "TasksConfig.ttl_s": "feedback bookkeeping, not routing (a replay sends no feedback)",
    "TasksConfig.early_feedback_s": "feedback bookkeeping, not routing",
    "StateConfig.retention_s": "how long slices are stored, longer than any replay",
    "StateConfig.redis_timeout_s": "a network timeout: Redis is not slowed by the time-lapse",
    "TimeoutsConfig.connect_s": "a TCP connect on the wall clock",
    "KeyConfig.max_usd_per_day": "money per UTC calendar day",
    "KeepWarmConfig.max_usd_per_day": "money per UTC calendar day",
    "ShadowConfig.max_usd_per_day": "money per UTC calendar day",
    "KeepWarmConfig.schedule_days": "days of history the keep-warm schedule learns from",
    **{
        f"DiscoveryConfig.{name}": "DNS on the wall clock: a replay's replicas join and leave in real time"
        for name in ("refresh_s", "forget_after_s", "timeout_s")
    },
    **{
        f"LimitsConfig.{name}": "client connection hygiene on the wall clock: the replay's clients are real"
        for name in (
            "discard_timeout_s",
            "drain_s",
            "header_timeout_s",
            "body_timeout_s",
            "keep_alive_s",
            "keyless_keep_alive_s",
            "client_write_timeout_s",
        )
    },
}


def scaled_fields() -> set[str]:
    """`Class.field` for every constant a time-lapse divides (or, for a rate, multiplies)."""
    sections = (*_TOP, *_MODEL, *_ENDPOINT, *_OPTIONAL_MODEL, *_BATCH, *_CANARY_CHECKS, *_OPTIONAL_ENDPOINT)
    found = {f"{cls.__name__}.{key}" for _, cls, keys in sections for key in keys}
    found |= {f"DedicatedEndpoint.{key}" for key in (*_DEDICATED_TIMES, *_DEDICATED_RATES)}
    return found | {f"KeyConfig.{key}" for key in _KEY_RATES}


def scale_config(text: str, factor: float, env: Mapping[str, str]) -> str:
    """The config in `text` as a time-lapse `factor` times faster (see the module doc).
    Raises ConfigError (naming the key) when the result is not a valid config."""
    if factor < 1:
        raise ValueError("--speed must be at least 1 to scale a config")
    parse_config(text, env)  # the original must be valid before anything is scaled
    raw = yaml.safe_load(text)
    raw["time_scale"] = factor * float(raw.get("time_scale", 1.0))
    for section, cls, keys in _TOP:
        _divide(raw.setdefault(section, {}), cls, keys, factor)
    for model in (raw.get("models") or {}).values():
        _scale_model(model, factor)
    for key in (raw.get("auth") or {}).get("keys") or []:
        for name in _KEY_RATES:  # whole numbers: a limit is a count
            if isinstance(key.get(name), int) and not isinstance(key.get(name), bool):
                key[name] = max(1, round(key[name] * factor))
    scaled = yaml.safe_dump(raw, sort_keys=False)
    parse_config(scaled, env)  # a constant below its bound: ConfigError names it
    return f"# time-lapse x{factor:g} of this config for tidegate replay --speed {factor:g}\n" + scaled


def _scale_model(model: dict[str, Any], factor: float) -> None:
    """One model's routing, SLO, retry, breaker, canary and endpoint constants."""
    for section, cls, keys in _MODEL:
        _divide(model.setdefault(section, {}), cls, keys, factor)
    for section, cls, keys in _BATCH:
        _divide(model["routing"].setdefault(section, {}), cls, keys, factor)
    for section, cls, keys in _OPTIONAL_MODEL:
        if isinstance(model.get(section), dict):
            _divide(model[section], cls, keys, factor)
    if isinstance(model.get("canary"), dict):
        for section, cls, keys in _CANARY_CHECKS:
            _divide(model["canary"].setdefault(section, {}), cls, keys, factor)
    for endpoint in model.get("dedicated") or []:
        _divide(endpoint, DedicatedEndpoint, _DEDICATED_TIMES, factor)
        _divide(endpoint, DedicatedEndpoint, _DEDICATED_RATES, 1 / factor)
    for endpoint in [*(model.get("dedicated") or []), *(model.get("serverless") or [])]:
        for section, cls, keys in _ENDPOINT:
            _divide(endpoint.setdefault(section, {}), cls, keys, factor)
        for section, cls, keys in _OPTIONAL_ENDPOINT:
            if isinstance(endpoint.get(section), dict):
                _divide(endpoint[section], cls, keys, factor)


def _divide(section: dict[str, Any], cls: type[BaseModel], keys: tuple[str, ...], factor: float) -> None:
    for key in keys:
        value = section.get(key, cls.model_fields[key].default)
        if isinstance(value, int | float) and not isinstance(value, bool):
            section[key] = value / factor
