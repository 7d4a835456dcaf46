"""Bearer keys: kept as SHA-256 digests, compared in constant time. One check for the
client API keys and the admin key, so both read the header and compare the same way.

A check names the caller: `key-` and the first 12 hex digits of its key's digest (stable
across restarts and replicas, and not the secret), `anonymous` when the gateway runs open,
`admin` for the admin key. Tasks and feedback belong to their caller, and the canary weighs
callers by this name (router/record/tasks.py, router/canary/analysis.py).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from starlette.requests import Request

from router.errors import Unauthorized

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


class KeyDigests:
    """A set of secret keys that never keeps the keys themselves."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = tuple(_digest(k) for k in keys if k)

    def __bool__(self) -> bool:
        return bool(self._digests)

    def match(self, token: str) -> bytes | None:
        """The digest of the key `token` is, if it is one (every digest is compared)."""
        given = _digest(token)
        found = None
        for known in self._digests:
            if hmac.compare_digest(given, known):
                found = known
        return found

    def accepts(self, token: str) -> bool:
        return self.match(token) is not None


class ApiKeys:
    """Client API keys; with none configured every client is let in (as `anonymous`)."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = KeyDigests(keys)

    def check(self, request: Request) -> str:
        """The caller's name; Unauthorized without a valid key (when keys are configured)."""
        if not self._keys:
            return ANONYMOUS
        token = bearer_token(request)
        if token is None:
            raise Unauthorized("You didn't provide an API key. Provide it as 'Authorization: Bearer KEY'.")
        found = self._keys.match(token)
        if found is None:
            raise Unauthorized("Incorrect API key provided.")
        return "key-" + found.hex()[:12]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()
