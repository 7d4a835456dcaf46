"""Bearer keys: kept as SHA-256 digests, compared in constant time. One check for the
client API keys and the admin key, so both read the header and compare the same way."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from starlette.requests import Request

from router.errors import Unauthorized


def bearer_token(request: Request) -> str | None:
    """The token of `Authorization: Bearer TOKEN`, or None when there is none."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class KeyDigests:
    """A set of secret keys that never keeps the keys themselves."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = tuple(_digest(k) for k in keys if k)

    def __bool__(self) -> bool:
        return bool(self._digests)

    def accepts(self, token: str) -> bool:
        given = _digest(token)
        return any(hmac.compare_digest(given, known) for known in self._digests)


class ApiKeys:
    """Client API keys; with none configured every client is let in."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = KeyDigests(keys)

    def check(self, request: Request) -> None:
        if not self._keys:
            return
        token = bearer_token(request)
        if token is None:
            raise Unauthorized("You didn't provide an API key. Provide it as 'Authorization: Bearer KEY'.")
        if not self._keys.accepts(token):
            raise Unauthorized("Incorrect API key provided.")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()
