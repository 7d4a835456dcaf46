"""Policies by name, so a model's config names its policy and no code compares strings."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from policies.base import Policy
from policies.dedicated_first import DedicatedFirst

PolicyFactory = Callable[[], Policy]

BUILTIN: Mapping[str, PolicyFactory] = MappingProxyType({"dedicated_first": DedicatedFirst})


def build(name: str, registry: Mapping[str, PolicyFactory] = BUILTIN) -> Policy:
    try:
        factory = registry[name]
    except KeyError:
        known = ", ".join(sorted(registry))
        raise KeyError(f"unknown policy {name!r} (known: {known})") from None
    return factory()
