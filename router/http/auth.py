"""Bearer keys: kept as SHA-256 digests, compared in constant time. One check for the
client API keys and the admin key, so both read the header and compare the same way.

A check names the caller: a named key (`auth.keys`, or one made through the admin API) by its
name, an `auth.api_keys` key by `key-` and the first 12 hex digits of its digest (stable
across restarts and replicas, and not the secret), `anonymous` when the gateway runs open,
`admin` for the admin key. Tasks and feedback belong to their caller, and the canary weighs
callers by this name (router/record/tasks.py, router/canary/analysis.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from starlette.requests import Request

from router.config import AuthConfig, KeyConfig
from router.errors import StoreUnavailable, Unauthorized
from router.periodic import Loops, stop

log = logging.getLogger("tidegate")

ANONYMOUS = "anonymous"
ADMIN = "admin"


def bearer_token(request: Request) -> str | None:
    """The token of `Authorization: Bearer TOKEN`, or None when there is none."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def key_id(key: str) -> str:
    """The caller name of a client key (safe to log and store)."""
    return "key-" + _digest(key).hex()[:12]


def matching(given: bytes, digests: Iterable[bytes]) -> bytes | None:
    """`given` if it is one of `digests`, compared with every one of them in constant time
    (how long it takes says nothing of which key, if any, matched)."""
    found = None
    for known in digests:
        if hmac.compare_digest(given, known):
            found = known
    return found


class KeyDigests:
    """A set of secret keys that never keeps the keys themselves."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = tuple(_digest(k) for k in keys if k)

    def __bool__(self) -> bool:
        return bool(self._digests)

    def match(self, token: str) -> bytes | None:
        """The digest of the key `token` is, if it is one (every digest is compared)."""
        return matching(_digest(token), self._digests)

    def accepts(self, token: str) -> bool:
        return self.match(token) is not None


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a valid key says is calling: the caller's name, and its tenant entry when the key is
    a named one (`auth.keys` or the admin API's keys); None for `auth.api_keys` and anonymous."""

    name: str
    key: KeyConfig | None = None


_ANONYMOUS_CALLER = Caller(ANONYMOUS)


@dataclass(frozen=True, slots=True)
class _Entry:
    key: KeyConfig
    until: float | None = None  # a rotated-out secret: valid until then (epoch seconds)


class MadeKeys(Protocol):
    async def made_keys(self) -> dict[str, bytes]: ...


class ApiKeys:
    """The client keys: `auth.api_keys` (interactive, no limits, named by digest), `auth.keys`
    and the keys made through the admin API (router/http/keys_admin.py), which every replica
    reads from the store every `refresh_s`. With none at all, every client is let in as
    `anonymous` (the config allows that only with `auth.allow_anonymous`)."""

    def __init__(
        self,
        auth: AuthConfig,
        store: MadeKeys | None = None,
        refresh_s: float = 0.5,
        loops: Loops | None = None,
        on_revoked: Callable[[str], None] | None = None,
    ) -> None:
        self._loops = loops or Loops()
        self._on_revoked = on_revoked  # a key revoked (or gone) since the last refresh: its name
        self._plain_digests = tuple(_digest(k) for k in auth.api_keys)
        self._plain_set = frozenset(self._plain_digests)
        self._configured = {_secret_digest(k): _Entry(k) for k in auth.keys}
        self._made: dict[bytes, _Entry] = {}
        self._revoked: frozenset[str] = frozenset()
        self._open = not (auth.api_keys or auth.keys)  # the config allows that only with allow_anonymous
        self.anyone = self._open  # every connection is a client's (router/http/connection.py)
        self._store, self._refresh_s = store, refresh_s
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.configured_names = frozenset(k.name for k in auth.keys)

    def check(self, request: Request) -> Caller:
        """The caller; Unauthorized without a valid, unexpired key (when keys are configured)."""
        if self._open and not self._made:  # no key that could name a caller: the header is moot
            return _ANONYMOUS_CALLER
        token = bearer_token(request)
        if token is None:
            if self._open:
                return _ANONYMOUS_CALLER
            raise Unauthorized("You didn't provide an API key. Provide it as 'Authorization: Bearer KEY'.")
        given = _digest(token)
        found = matching(given, self._plain_digests)
        if found is not None:
            return Caller("key-" + found.hex()[:12])
        entry = self._named(given)
        if entry is None:  # an open gateway lets anyone in; a key made at run time still names its caller
            if self._open:
                return _ANONYMOUS_CALLER
            raise Unauthorized("Incorrect API key provided.")
        expires = entry.key.expires_at
        if expires is not None and expires.timestamp() <= time.time():
            raise Unauthorized(f"This API key expired at {expires.isoformat()}.")
        return Caller(entry.key.name, entry.key)

    def caller_of(self, authorization: bytes) -> str | None:
        """The caller a raw Authorization header's valid key names (None: no valid key), for
        the connection layer's fair shares before the app runs (router/http/shares.py). A
        lookup by the token's digest: what it takes says nothing of any key's secret."""
        scheme, _, token = authorization.partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            return None
        digest = hashlib.sha256(token).digest()
        if digest in self._plain_set:
            return "key-" + digest.hex()[:12]
        entry = self._configured.get(digest) or self._made.get(digest)
        if entry is None or not self._valid(entry):
            return None
        return entry.key.name

    def _valid(self, entry: _Entry) -> bool:
        if entry.key.name in self._revoked:
            return False
        now = time.time()
        if entry.until is not None and entry.until <= now:
            return False
        expires = entry.key.expires_at
        return expires is None or expires.timestamp() > now

    def _named(self, digest: bytes) -> _Entry | None:
        known = matching(digest, itertools.chain(self._configured, self._made))
        found = None if known is None else self._configured.get(known) or self._made.get(known)
        if found is None or found.key.name in self._revoked:
            return None
        if found.until is not None and found.until <= time.time():
            return None
        return found

    async def refresh(self) -> None:
        """Read the keys made through the admin API (and revocations) from the store."""
        if self._store is None:
            return
        made: dict[bytes, _Entry] = {}
        revoked = set()
        for name, raw in (await self._store.made_keys()).items():
            try:
                stored = orjson.loads(raw)
                if stored.get("revoked"):
                    revoked.add(name)
                    continue
                key = stored_key(stored)
                for secret in stored["secrets"]:
                    made[bytes.fromhex(secret["sha256"])] = _Entry(key, secret.get("until"))
            except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
                log.warning("client keys: the stored key %r is unreadable and not accepted: %r", name, exc)
        gone = (revoked - self._revoked) | (
            {e.key.name for e in self._made.values()} - {e.key.name for e in made.values()} - revoked
        )
        self._made, self._revoked = made, frozenset(revoked)
        if self._on_revoked is not None:
            for name in sorted(gone):
                self._on_revoked(name)

    def start(self) -> None:
        """Read the store's keys now and every `refresh_s`; while the store is unreachable the
        keys last read stay in force."""
        if self._task is None and self._store is not None:
            self._stop = asyncio.Event()
            survives = (StoreUnavailable,)
            loop = self._loops.every(
                "client keys refresh", self._refresh_s, self.refresh, self._stop, survives=survives
            )
            self._task = asyncio.get_running_loop().create_task(loop)

    async def close(self) -> None:
        await stop(self._task, self._stop)
        self._task = None


def stored_key(stored: dict[str, Any]) -> KeyConfig:
    """A key made through the admin API, from its stored entry: its fields and its newest
    secret's digest (router/http/keys_admin.py writes them). ValueError, KeyError or
    IndexError for an entry that is not one."""
    return KeyConfig.model_validate(stored["key"] | {"key_sha256": stored["secrets"][0]["sha256"]})


def _secret_digest(key: KeyConfig) -> bytes:
    return bytes.fromhex(key.key_sha256) if key.key_sha256 else _digest(key.key)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()
