"""The gateway's configuration: typed, frozen sections loaded from YAML plus the environment
(router/config/loading.py). Everything a consumer needs is named here."""

from __future__ import annotations

from router.config.endpoints import (
    WEEKDAYS,
    DedicatedEndpoint,
    Endpoint,
    EndpointConfig,
    EngineSignalConfig,
    KeepWarmConfig,
    ScheduleEntry,
    ServerlessEndpoint,
    TimeoutsConfig,
)
from router.config.gateway import ConfigError, GatewayConfig
from router.config.loading import load_config, parse_config
from router.config.model import (
    BatchConfig,
    BreakerConfig,
    CanaryChecks,
    CanaryControllerConfig,
    HedgeConfig,
    ModelConfig,
    PlacementConfig,
    ResponseModel,
    RetryConfig,
    RoutingConfig,
    ShadowConfig,
    SloConfig,
    SuccessConfig,
)
from router.config.sections import (
    AuthConfig,
    LimitsConfig,
    ListenConfig,
    ServerConfig,
    StateConfig,
    TasksConfig,
)
from router.config.tenants import KeyConfig, Priority

__all__ = [
    "WEEKDAYS",
    "AuthConfig",
    "BatchConfig",
    "BreakerConfig",
    "CanaryChecks",
    "CanaryControllerConfig",
    "ConfigError",
    "DedicatedEndpoint",
    "Endpoint",
    "EndpointConfig",
    "EngineSignalConfig",
    "GatewayConfig",
    "HedgeConfig",
    "KeepWarmConfig",
    "KeyConfig",
    "LimitsConfig",
    "ListenConfig",
    "ModelConfig",
    "PlacementConfig",
    "Priority",
    "ResponseModel",
    "RetryConfig",
    "RoutingConfig",
    "ScheduleEntry",
    "ServerConfig",
    "ServerlessEndpoint",
    "ShadowConfig",
    "SloConfig",
    "StateConfig",
    "SuccessConfig",
    "TasksConfig",
    "TimeoutsConfig",
    "load_config",
    "parse_config",
]
