"""The gateway-wide sections of the config: where it listens, who it believes, its state store,
its keys, its limits, and how long tasks are tracked."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from router.config.frozen import Frozen
from router.config.tenants import KeyConfig


class ListenConfig(Frozen):
    host: str = "127.0.0.1"  # the address to listen on (`serve --host` overrides)
    # the port (`serve --port` overrides; 0: any free port)
    port: Annotated[int, Field(ge=0, le=65535)] = 8000


class ServerConfig(Frozen):
    """The HTTP server. `forwarded_allow_ips`: the proxies (IPs, CIDRs, or "*") whose
    X-Forwarded-For and X-Forwarded-Proto are believed; empty, nobody's are (the client's
    address is the socket's). `metrics_listen`: serve `/metrics` (every tenant's name, team and
    spend) on a listener of its own, and not on the client port; none: on the client port."""

    # proxies (IPs, CIDRs or "*") whose X-Forwarded-For is believed; empty: nobody's
    forwarded_allow_ips: tuple[str, ...] = ()
    metrics_listen: ListenConfig | None = None

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _addresses(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        for entry in entries:
            if entry != "*":
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise ValueError(f"{entry!r} is not an IP address, a CIDR or *") from None
        return entries


class StateConfig(Frozen):
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
    # a Redis command without a reply this long cuts its connection (the commands in flight
    # fail, the next opens a new one); also the connect timeout
    redis_timeout_s: Annotated[float, Field(gt=0, le=60)] = 1.0
    # how a single Redis is spoken to: `line`, the store's own connections (the cheapest per
    # request), or `redis-py`, its pooled client (for Sentinel, redis+sentinel:// URLs, and
    # redis_password_file); Redis Cluster always uses redis-py's cluster client
    redis_client: Literal["line", "redis-py"] = "line"
    # a file holding the Redis password (a mounted secret), read for every new connection so
    # a rotated password is used without a restart; needs redis_client: redis-py
    redis_password_file: str = ""
    leader_ttl_s: Annotated[float, Field(ge=1, le=300)] = 10.0  # the canary controller's leader lease


class AuthConfig(Frozen):
    """Client keys that all resolve empty refuse to start, unless `allow_anonymous` says to
    run open: a missing secret must never silently open the gateway."""

    api_keys: tuple[str, ...] = ()  # empty strings are dropped; each an interactive key without a name
    keys: tuple[KeyConfig, ...] = ()  # named keys: tenants with limits and budgets (docs/tenants.md)
    allow_anonymous: bool = False  # true: serve without client keys (said explicitly; refused beside keys)
    admin_key: str = ""  # empty: the admin API answers 403

    @field_validator("api_keys")
    @classmethod
    def _drop_empty(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(k for k in keys if k)

    @model_validator(mode="after")
    def _closed_unless_said(self) -> AuthConfig:
        keyed = self.api_keys or self.keys
        if not keyed and not self.allow_anonymous:
            raise ValueError(
                "no client API key is set (every auth.api_keys entry is empty or missing, and no "
                "auth.keys); set one, or set auth.allow_anonymous: true to serve without keys"
            )
        if keyed and self.allow_anonymous:
            raise ValueError("auth.allow_anonymous: true and client keys both set; choose one")
        if self.admin_key and self.admin_key in (*self.api_keys, *(k.key for k in self.keys)):
            raise ValueError("auth.admin_key must differ from every client key")
        both = [k.name for k in self.keys if k.key and k.key in self.api_keys]
        if both:
            raise ValueError(f"auth.keys {both[0]}: its key is also in auth.api_keys; keep it in one place")
        names = [k.name for k in self.keys]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"auth.keys: the name {twice[0]!r} is used twice")
        return self


CONNECTION_BYTES = 16 * 1024  # what an open connection costs besides its head (measured: docs/security.md)


class LimitsConfig(Frozen):
    """Every resource a client or an upstream can grow, bounded per process.
    docs/security.md says what the client gets when each is hit."""

    max_body_bytes: Annotated[int, Field(gt=0)] = 4 * 1024 * 1024  # proxied /v1 paths: 413 above
    # the admin API, feedback and every other path: 413 above (checked before auth)
    max_control_body_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024
    # bodies held by the requests in flight of one process; a head that does not fit: 503
    max_body_bytes_in_flight: Annotated[int, Field(gt=0)] = 256 * 1024 * 1024
    # after a refusal (or an answer before the body ended), the rest of the body is read and
    # dropped for at most this long and this many bytes, then the connection closes
    discard_timeout_s: Annotated[float, Field(gt=0, le=600)] = 5.0
    # a refused body is read and dropped up to this much, then the connection closes
    max_discard_bytes: Annotated[int, Field(ge=0)] = 64 * 1024 * 1024
    max_output_tokens: Annotated[int, Field(gt=0)] = 1 << 20  # a larger max_tokens is refused (400)
    # a request without a token limit reserves this many output tokens against its key's tpm
    # and budgets (docs/tenants.md); the answer's real usage settles it
    reserved_output_tokens: Annotated[int, Field(gt=0)] = 4096
    max_n: Annotated[int, Field(ge=1, le=128)] = 8  # `n` / `best_of` above: 400
    drain_s: Annotated[int, Field(ge=1)] = 30  # on SIGTERM, in-flight requests get this long (s)
    max_in_flight: Annotated[int, Field(ge=1)] = 1024  # /v1 requests at once; more: 503 + Retry-After
    max_connections: Annotated[int, Field(ge=1)] = 4096  # open client connections; more are closed
    max_header_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024  # request line + headers; more: 431
    header_timeout_s: Annotated[float, Field(gt=0)] = 10.0  # connect/idle -> end of headers; else 408
    body_timeout_s: Annotated[float, Field(gt=0)] = 60.0  # headers -> end of body; else 408
    keep_alive_s: Annotated[float, Field(gt=0)] = 90.0  # idle keep-alive; above clients' and LBs' own
    # idle keep-alive of a connection whose last request had no valid key
    keyless_keep_alive_s: Annotated[float, Field(gt=0)] = 5.0
    # one key, or one address without a key, holds at most this share of the body budget and of
    # the connections (a trusted proxy's connections are not one address's); past it: 429
    max_share_per_caller: Annotated[float, Field(gt=0, le=1)] = 0.25
    request_timeout_s: Annotated[float, Field(gt=0)] = 600.0  # the whole request, retries included: 504
    client_write_timeout_s: Annotated[float, Field(gt=0)] = 30.0  # a client not reading this long: cut
    max_response_bytes: Annotated[int, Field(gt=0)] = 64 * 1024 * 1024  # an upstream body above: 502
    max_event_bytes: Annotated[int, Field(gt=0)] = 8 * 1024 * 1024  # one upstream SSE event above: cut

    @model_validator(mode="after")
    def _one_body_fits(self) -> LimitsConfig:
        # a request holds its body twice (as read, and as sent upstream: router/http/shares.py)
        share = int(self.max_share_per_caller * self.max_body_bytes_in_flight)
        if 2 * self.max_body_bytes > share:
            raise ValueError(
                f"a request holds its body twice, and 2 x max_body_bytes ({2 * self.max_body_bytes}) must "
                "fit one caller's share of the body budget (max_share_per_caller x max_body_bytes_in_flight"
                f" = {share}): raise max_body_bytes_in_flight or max_share_per_caller, or lower it"
            )
        return self

    def worst_case_bytes(self) -> int:
        """What clients can make one process hold at most: the body budget (which counts every
        copy of a body the gateway holds: router/http/shares.py), plus the request head and
        the bookkeeping of every open connection (a body nobody reads is dropped, not kept),
        plus one body parsed at a time on the event loop (only its top level: router/openai.py).
        docs/security.md gives the measured figure behind `CONNECTION_BYTES`."""
        per_connection = self.max_header_bytes + CONNECTION_BYTES
        return self.max_body_bytes_in_flight + self.max_connections * per_connection


class TasksConfig(Frozen):
    """Tasks (requests grouped by `x-tidegate-task-id`, or one request each) are tracked this
    long for feedback (`POST /v1/feedback`), at most `max_tracked` per process (memory store;
    Redis keeps them by TTL alone)."""

    # a task takes feedback this long after its last request
    ttl_s: Annotated[float, Field(ge=60, le=7 * 86400)] = 3600.0
    # the memory store tracks at most this many tasks (oldest dropped; Redis keeps them by TTL)
    max_tracked: Annotated[int, Field(ge=1000)] = 200_000
    # failure feedback on a request or task not settled yet is kept this long, at most this
    # many per key (past that: 429); it never displaces a tracked task
    early_feedback_s: Annotated[float, Field(ge=1, le=3600)] = 60.0
    # early feedback kept per key at most (more: 429)
    max_early_feedback: Annotated[int, Field(ge=1, le=100_000)] = 100


class DiscoveryConfig(Frozen):
    """How pools declared by `replica_dns` are found (router/fleet/): every `refresh_s` the
    names are resolved, and each replica address keeps one slot set (NAME-i) that every gateway
    replica agrees on through the state store."""

    refresh_s: Annotated[float, Field(ge=0.05, le=60)] = 1.0  # re-read each pool's A/AAAA records this often
    # a slot set whose address no gateway replica has resolved this long, and that holds no
    # lease, is freed for the next new replica; longer than any replica's refresh and DNS TTL
    forget_after_s: Annotated[float, Field(ge=1, le=3600)] = 10.0
    # "host" or "host:port" to ask instead of the system resolver (empty: /etc/resolv.conf and hosts)
    nameservers: tuple[str, ...] = ()
    timeout_s: Annotated[float, Field(gt=0, le=30)] = 2.0  # one resolution, every record type

    @field_validator("nameservers")
    @classmethod
    def _addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for server in value:
            nameserver_address(server)
        return value

    @model_validator(mode="after")
    def _forget_after_refresh(self) -> DiscoveryConfig:
        if self.forget_after_s <= 3 * self.refresh_s:
            raise ValueError(
                "forget_after_s must be over 3 x refresh_s: a slot set is freed only when no "
                "gateway replica can still be sending to its address"
            )
        return self


def nameserver_address(server: str) -> tuple[str, int]:
    """`host` or `host:port` (`[v6]:port`) as (IP address, port); a name is refused, since
    resolving the resolver would need a resolver."""
    host, port = server, 53
    if server.startswith("["):
        host, _, rest = server[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else -1 if rest else 53
    elif server.count(":") == 1:
        host, _, text = server.partition(":")
        port = int(text) if text.isdigit() else -1
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"nameserver {server!r}: give an IP address (and :port), not a name") from None
    if not 0 < port < 65536:
        raise ValueError(f"nameserver {server!r}: the port must be 1-65535")
    return host, port
