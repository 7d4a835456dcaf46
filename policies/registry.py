"""Policies by name, so a model's config names its policy and no code compares strings."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from policies.base import Policy
from policies.canary import CanaryGate
from policies.dedicated_first import DedicatedFirst
from policies.pipeline import Pipeline

PolicyFactory = Callable[[], Policy]


def _dedicated_first() -> Policy:
    return Pipeline(filters=(CanaryGate(),), picker=DedicatedFirst())


BUILTIN: Mapping[str, PolicyFactory] = MappingProxyType({"dedicated_first": _dedicated_first})


def build(name: str, registry: Mapping[str, PolicyFactory] = BUILTIN) -> Policy:
    try:
        factory = registry[name]
    except KeyError:
        known = ", ".join(sorted(registry))
        raise KeyError(f"unknown policy {name!r} (known: {known})") from None
    return factory()
