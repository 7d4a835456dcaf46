"""The whole config, its cross-section checks, and the route names it defines."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from policies.predicted_ttft import Admission
from policies.types import route_key
from router.config.frozen import Frozen
from router.config.model import ModelConfig
from router.config.sections import (
    AuthConfig,
    DiscoveryConfig,
    LimitsConfig,
    ListenConfig,
    ServerConfig,
    StateConfig,
    TasksConfig,
)


class ConfigError(Exception):
    """The configuration cannot be used; `problems` lists each one as `path: message`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration:\n" + "\n".join(f"  {p}" for p in problems))
        self.problems = problems


class GatewayConfig(Frozen):
    # a time-lapse for replays: the time constants were divided by this (tidegate/offline/timelapse.py)
    time_scale: Annotated[float, Field(ge=1, le=1000)] = 1.0
    listen: ListenConfig = ListenConfig()  # where `serve` listens
    server: ServerConfig = ServerConfig()
    tasks: TasksConfig = TasksConfig()
    state: StateConfig = StateConfig()  # the state store: in-memory (one process) or Redis (every replica)
    # validated like a written one: a config with no `auth` at all refuses to start, too
    auth: AuthConfig = Field(default_factory=dict, validate_default=True)
    limits: LimitsConfig = LimitsConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()  # pools found by DNS (replica_dns)
    models: Mapping[str, ModelConfig]  # the models clients name, each with its routes (at least one model)

    @field_validator("models")
    @classmethod
    def _at_least_one(cls, models: Mapping[str, ModelConfig]) -> Mapping[str, ModelConfig]:
        if not models:
            raise ValueError("at least one model must be configured")
        return models

    @model_validator(mode="after")
    def _keys_name_known_models(self) -> GatewayConfig:
        for i, key in enumerate(self.auth.keys):
            unknown = sorted(set(key.models or ()) - set(self.models))
            if unknown:
                raise ValueError(
                    f"auth.keys[{i}] ({key.name}).models: {unknown[0]!r} is not a configured model"
                )
        return self

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


def check_endpoints(config: GatewayConfig) -> None:
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
