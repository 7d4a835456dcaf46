"""What the store's batchers talk to, from `state.redis_url` and `state.redis_client`.

- `line` (the default): a single Redis on the store's own connections (router/state/redis/
  line.py); the cheapest per request (docs/benchmarks.md#redis-clients).
- `redis-py`: redis-py's asyncio client and its connection pool. For what only a maintained
  client does: Redis Sentinel (`redis+sentinel://host:26379[,host:port...]/SERVICE[/db]`,
  the master found and followed through failovers) and a credential provider
  (`state.redis_password_file`, re-read for every new connection, so a rotated secret is
  used without a restart). The batchers share the one client: commands still go down in one
  pipeline per event-loop turn.
- Redis Cluster (`redis+cluster://` or `state.redis_cluster`) is always redis-py's cluster client.

Every path reads the URL with one parser (router/state/redis/address.py): an option means the
same on each, and one none of them implements is refused at start, naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.sentinel import Sentinel
from redis.credentials import CredentialProvider

from router.state.redis.address import BadRedisUrl, RedisAddress, parse_url, read_url

ClientName = Literal["line", "redis-py"]
Target = RedisAddress | Redis | RedisCluster
POOL_CONNECTIONS = 32  # redis-py's pool (per node on a cluster): more callers wait for one


class PasswordFile(CredentialProvider):
    """The password in a file (a mounted Kubernetes secret), read for every new connection."""

    def __init__(self, path: Path, username: str | None) -> None:
        self.path, self.username = path, username

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        password = self.path.read_text(encoding="utf-8").strip()
        return (self.username, password) if self.username else (password,)


def target_of(
    url: str,
    *,
    cluster: bool,
    timeout_s: float,
    client: ClientName = "line",
    password_file: str = "",
) -> Target:
    """What the Batcher talks to (module doc); BadRedisUrl names what cannot be used."""
    if "+sentinel://" in url:
        if client != "redis-py":
            raise BadRedisUrl("a Sentinel URL needs state.redis_client: redis-py")
        return _sentinel_master(url, timeout_s, password_file)
    plain, address, names_cluster = read_url(url)
    credentials = _credentials(password_file, address.username)
    if cluster or names_cluster:
        return RedisCluster.from_url(
            plain,
            max_connections=POOL_CONNECTIONS,
            credential_provider=credentials,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
        )
    if client == "redis-py":
        return Redis.from_url(
            plain,
            max_connections=POOL_CONNECTIONS,
            credential_provider=credentials,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
        )
    if password_file:
        raise BadRedisUrl("state.redis_password_file needs state.redis_client: redis-py")
    return address


def keyed(exc: BadRedisUrl) -> str:
    """The problem as an error names it: under its own key, else under state.redis_url."""
    message = str(exc)
    return message if message.startswith("state.") else f"state.redis_url: {message}"


def _credentials(password_file: str, username: str | None) -> PasswordFile | None:
    if not password_file:
        return None
    path = Path(password_file)
    try:
        path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadRedisUrl(f"state.redis_password_file: {exc}") from None
    return PasswordFile(path, username)


def _sentinel_master(url: str, timeout_s: float, password_file: str) -> Redis:
    """`redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE[/db][?options]`:
    the sentinels to ask, the service whose master to follow; the URL's credentials and
    options are the master's (the sentinels are asked without them)."""
    tls = url.startswith("rediss+sentinel://")
    rest = url.split("://", 1)[1]
    netloc, _, path_and_query = rest.partition("/")
    credentials, _, hosts = netloc.rpartition("@")
    sentinels = [_host_port(entry) for entry in hosts.split(",") if entry]
    path, _, query = path_and_query.partition("?")
    service, _, db = path.partition("/")
    if not sentinels or not service:
        raise BadRedisUrl(
            "a Sentinel URL names its sentinels and a service: redis+sentinel://HOST:PORT/SERVICE"
        )
    scheme = "rediss" if tls else "redis"
    master_url = f"{scheme}://{credentials + '@' if credentials else ''}127.0.0.1/{db or 0}"
    address = parse_url(master_url + (f"?{query}" if query else ""))  # the same options as any URL
    kwargs: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "db": address.db,
        "protocol": address.protocol,
    }
    if tls:
        kwargs |= {
            "ssl": True,
            "ssl_cert_reqs": "required" if address.verify else "none",
            "ssl_ca_certs": address.ca_file,
            "ssl_certfile": address.cert_file,
            "ssl_keyfile": address.key_file,
            "ssl_check_hostname": address.check_hostname,
        }
    provider = _credentials(password_file, address.username)
    if provider is not None:
        kwargs["credential_provider"] = provider
    else:  # as parse_url read them, the URL's own or its ?username= / ?password= options
        kwargs["username"], kwargs["password"] = address.username, address.password
    sentinel = Sentinel(sentinels, socket_timeout=timeout_s, sentinel_kwargs={"socket_timeout": timeout_s})
    master: Redis = sentinel.master_for(service, max_connections=POOL_CONNECTIONS, **kwargs)
    return master


def _host_port(entry: str) -> tuple[str, int]:
    host, _, port = entry.rpartition(":")
    if not host:
        return entry, 26379
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise BadRedisUrl(f"sentinel {entry!r}: expected HOST:PORT") from None
