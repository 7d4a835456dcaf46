"""A dedicated endpoint declared as a pool of replicas (`replica_urls`) becomes, once loaded,
one dedicated endpoint per replica: `NAME-0`, `NAME-1`, ... in the listed order, each with the
entry's `max_concurrency` slots, its own breaker, leases and engine signal, priced as one
replica. Everything downstream (placement, admission, the store, reports) sees replicas as it
sees any dedicated endpoints, so the pool's capacity is their sum, exact across gateway
replicas as for one endpoint.

An engine signal's `metrics_url` is each replica's: the replica URL's scheme, host and port
with the `metrics_url`'s own path (`http://vllm-0:8000/metrics` for a replica at
`http://vllm-0:8000/v1` and `metrics_url: http://any/metrics`).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from router.config.endpoints import DedicatedEndpoint
from router.config.gateway import GatewayConfig


def replica_name(pool: str, index: int) -> str:
    return f"{pool}-{index}"


def replicas_of(entry: DedicatedEndpoint) -> tuple[DedicatedEndpoint, ...]:
    """The dedicated endpoints an entry stands for: itself, one per replica URL, or, found by
    DNS, one slot set per replica it may have (each keeps `replica_dns`: its address is
    given at run time, router/fleet/)."""
    if entry.replica_dns and entry.max_replicas:
        return tuple(
            entry.model_copy(update={"name": replica_name(entry.name, i)}) for i in range(entry.max_replicas)
        )
    if not entry.replica_urls:
        return (entry,)
    return tuple(
        entry.model_copy(
            update={
                "name": replica_name(entry.name, i),
                "base_url": url,
                "replica_urls": (),
                "engine_signal": entry.engine_signal
                and entry.engine_signal.model_copy(
                    update={"metrics_url": _metrics_url(url, entry.engine_signal.metrics_url)}
                ),
            }
        )
        for i, url in enumerate(entry.replica_urls)
    )


def expand_pools(config: GatewayConfig) -> GatewayConfig:
    """`config` with every pool entry replaced by its replicas (the same object when none)."""
    pooled = {
        name
        for name, model in config.models.items()
        if any(d.replica_urls or d.replica_dns for d in model.dedicated)
    }
    if not pooled:
        return config
    models = {
        name: model.model_copy(
            update={"dedicated": tuple(r for d in model.dedicated for r in replicas_of(d))}
        )
        if name in pooled
        else model
        for name, model in config.models.items()
    }
    return config.model_copy(update={"models": models})


def _metrics_url(replica_url: str, metrics_url: str) -> str:
    replica, metrics = urlsplit(replica_url), urlsplit(metrics_url)
    return urlunsplit((replica.scheme, replica.netloc, metrics.path, metrics.query, ""))
