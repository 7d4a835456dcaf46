"""Where Redis is and how to open a connection to it, read from `state.redis_url`:

    redis://[[user]:password@]host[:port][/db][?protocol=3]
    rediss://...   TLS (?ssl_cert_reqs=none, ?ssl_ca_certs=PATH, ?ssl_check_hostname=false,
                   a client certificate for mutual TLS: ?ssl_certfile=PATH&ssl_keyfile=PATH)
    unix:///path/to/redis.sock[?db=N&password=...]

`redis+cluster://` and `rediss+cluster://` name a Redis Cluster (router/state/redis/batch.py).
Both paths take the same options and give them the same meaning: an option neither
implements (redis-py's `health_check_interval`, say) is refused, naming it, rather than
honoured on one path and dropped on the other; the reply timeout is `state.redis_timeout_s`.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

_SCHEMES = ("redis", "rediss", "unix")
_OPTIONS = ("protocol", "db", "username", "password")
_TLS_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_check_hostname", "ssl_certfile", "ssl_keyfile")
_SET_IN_CONFIG = dict.fromkeys(("socket_timeout", "socket_connect_timeout"), "state.redis_timeout_s")


class BadRedisUrl(ValueError):
    """`state.redis_url` cannot be used as it is written."""


@dataclass(frozen=True, slots=True)
class RedisAddress:
    host: str = "127.0.0.1"
    port: int = 6379
    unix_path: str | None = None
    username: str | None = None
    password: str | None = None
    db: int = 0
    tls: bool = False
    verify: bool = True
    ca_file: str | None = None
    check_hostname: bool = True
    cert_file: str | None = None  # a client certificate (mutual TLS), with key_file
    key_file: str | None = None
    protocol: int = 2  # 3: RESP3 (HELLO 3); push frames are then told apart from replies

    def handshake(self, client_name: str = "tidegate") -> list[tuple[str, ...]]:
        """The commands a new connection sends before any other: its protocol and
        credentials, its database, its name."""
        commands: list[tuple[str, ...]] = []
        auth: tuple[str, ...] = ()
        if self.password is not None:
            auth = (self.username or "default", self.password)
        if self.protocol == 3:
            commands.append(("HELLO", "3", *(("AUTH", *auth) if auth else ()), "SETNAME", client_name))
        else:
            if self.password is not None:
                commands.append(("AUTH", *auth) if self.username else ("AUTH", self.password))
            commands.append(("CLIENT", "SETNAME", client_name))
        if self.db:
            commands.append(("SELECT", str(self.db)))
        return commands

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file is not None:
            context.load_cert_chain(self.cert_file, self.key_file)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context.check_hostname = self.check_hostname
        return context


def parse_url(url: str) -> RedisAddress:
    """`url` as a RedisAddress; BadRedisUrl names what is wrong with it."""
    if "://" not in url:
        raise BadRedisUrl(f"{redacted(url)!r} has no scheme: expected redis://, rediss:// or unix://")
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES:
        raise BadRedisUrl(f"scheme {parts.scheme!r}: expected one of {', '.join(_SCHEMES)}")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    _check_options(query, tls=parts.scheme == "rediss")
    protocol = _integer(query.get("protocol", "2"), "protocol")
    if protocol not in (2, 3):
        raise BadRedisUrl(f"protocol={protocol}: expected 2 or 3")
    password = unquote(parts.password) if parts.password is not None else query.get("password")
    username = (unquote(parts.username) if parts.username else query.get("username")) or None
    if parts.scheme == "unix":
        db = _integer(query.get("db", "0"), "db")
        return RedisAddress(
            unix_path=parts.path, db=db, username=username, password=password, protocol=protocol
        )
    return RedisAddress(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 6379,
        db=_integer(parts.path.strip("/") or query.get("db", "0"), "db"),
        tls=parts.scheme == "rediss",
        verify=query.get("ssl_cert_reqs", "required") != "none",
        ca_file=query.get("ssl_ca_certs"),
        check_hostname=query.get("ssl_check_hostname", "true").lower() != "false",
        cert_file=query.get("ssl_certfile"),
        key_file=query.get("ssl_keyfile"),
        username=username,
        password=password,
        protocol=protocol,
    )


def read_url(url: str) -> tuple[str, RedisAddress, bool]:
    """`url` checked as start-up would use it: (the URL as redis-py reads it, its address,
    whether it names a Redis Cluster). The TLS files it names are loaded, so a missing or
    wrong certificate is refused here rather than at the first connection."""
    cluster = "+cluster://" in url
    plain = url.replace("+cluster://", "://", 1)
    address = parse_url(plain)
    try:
        address.ssl_context()
    except (OSError, ssl.SSLError) as exc:
        raise BadRedisUrl(f"TLS: {exc}") from None
    return plain, address, cluster


def _check_options(query: dict[str, str], *, tls: bool) -> None:
    """Refuse what the URL asks for and the connection would not do, naming it."""
    for name in query:
        if name in _SET_IN_CONFIG:
            raise BadRedisUrl(f"option {name!r}: set {_SET_IN_CONFIG[name]} instead")
        if name in _TLS_OPTIONS and not tls:
            raise BadRedisUrl(f"option {name!r} needs TLS: a rediss:// URL")
        if name not in _OPTIONS and name not in _TLS_OPTIONS:
            known = ", ".join((*_OPTIONS, *_TLS_OPTIONS))
            raise BadRedisUrl(f"option {name!r} is not implemented (the options: {known})")
    if "ssl_keyfile" in query and "ssl_certfile" not in query:
        raise BadRedisUrl("option 'ssl_keyfile' needs 'ssl_certfile' (the client certificate)")


def redacted(url: str) -> str:
    """`url` without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _integer(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise BadRedisUrl(f"{name}={text!r}: expected a whole number") from None
