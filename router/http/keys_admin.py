"""Client keys through the admin API (docs/tenants.md): create, rotate, list and revoke.

A made key is stored in the state store as its SHA-256 digest with its tenant fields, never
the secret, which is shown once, in the create or rotate answer. Every replica reads the
store's keys every 0.5 s (router/http/auth.py), so a new, rotated or revoked key is obeyed
everywhere within a second. A rotation keeps the old secret valid for `overlap_s` (default
3600 s). Revoking works for keys written in `auth.keys` too (the store keeps the revocation;
remove the key from the file to make it final); rotating those is done in the file.

    POST   /admin/keys                 {name, team, priority, models, rpm, tpm, max_usd_per_day,
                                        max_usd_per_month, expires_at}  -> the key, with `secret`
    POST   /admin/keys/{name}/rotate   {overlap_s}                      -> the key, with `secret`
    GET    /admin/keys                 every key (no secrets), with its spend today and this month
    DELETE /admin/keys/{name}          revoked on every replica within a second
"""

from __future__ import annotations

import hashlib
import secrets
import time
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson
from fastapi import APIRouter, Request
from pydantic import ValidationError

from router.config import GatewayConfig, KeyConfig
from router.errors import ClientError, InvalidRequest
from router.http.auth import ApiKeys, stored_key

_FIELDS = (
    "name",
    "team",
    "priority",
    "models",
    "rpm",
    "tpm",
    "max_usd_per_day",
    "max_usd_per_month",
    "expires_at",
)
MAX_OVERLAP_S = 30 * 86400


class KeyConflict(ClientError):
    status = 409
    code = "key_conflict"


class KeyNotFound(ClientError):
    status = 404
    code = "key_not_found"


class KeyStore(Protocol):
    async def put_key(self, name: str, entry: bytes, *, replacing: bytes | None = None) -> bool: ...

    async def made_keys(self) -> dict[str, bytes]: ...

    async def spent(self, key: str, day: str, month: str) -> tuple[float, float]: ...


def keys_routes(router: APIRouter, config: GatewayConfig, store: KeyStore, keys: ApiKeys, read: Any) -> None:
    """Add the keys routes to the admin router; `read(request)` is its JSON body reader."""
    admin = KeysAdmin(config, store, keys)

    @router.get("/keys")
    async def list_keys() -> dict[str, Any]:
        return {"keys": await admin.listed()}

    @router.post("/keys")
    async def create_key(request: Request) -> dict[str, Any]:
        return await admin.create(await read(request))

    @router.post("/keys/{name}/rotate")
    async def rotate_key(name: str, request: Request) -> dict[str, Any]:
        return await admin.rotate(name, (await read(request)).get("overlap_s", 3600))

    @router.delete("/keys/{name}")
    async def revoke_key(name: str) -> dict[str, Any]:
        return await admin.revoke(name)


class KeysAdmin:
    def __init__(self, config: GatewayConfig, store: KeyStore, keys: ApiKeys) -> None:
        self._config, self._store, self._keys = config, store, keys

    async def listed(self) -> list[dict[str, Any]]:
        made = {name: orjson.loads(raw) for name, raw in (await self._store.made_keys()).items()}
        found = [
            _view(key, "config") | {"revoked": bool(made.get(key.name, {}).get("revoked"))}
            for key in self._config.auth.keys
        ]
        for name, stored in made.items():
            if stored.get("revoked") or name in self._keys.configured_names:
                continue
            try:
                key = stored_key(stored)
            except (ValueError, KeyError, TypeError, IndexError):  # refused by every replica too
                found.append({"name": name, "source": "admin", "unreadable": True, "team": "-"})
                continue
            secrets_ = [{"until": s.get("until")} for s in stored["secrets"]]
            found.append(_view(key, "admin") | {"revoked": False, "secrets": secrets_})
        now = datetime.now(UTC)
        for entry in found:
            day, month = await self._store.spent(
                entry["name"], now.strftime("%Y-%m-%d"), now.strftime("%Y-%m")
            )
            entry["spent_usd_today"], entry["spent_usd_this_month"] = round(day, 6), round(month, 6)
        return found

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(body) - set(_FIELDS))
        if unknown:
            raise InvalidRequest(
                f"unknown field {unknown[0]!r}; one of {', '.join(_FIELDS)}", param=unknown[0]
            )
        secret, digest = _new_secret()
        key = _validated(body | {"key_sha256": digest}, self._config)
        existing = (await self._store.made_keys()).get(key.name)
        taken = existing is not None and not orjson.loads(existing).get("revoked")
        if key.name in self._keys.configured_names or taken:
            raise KeyConflict(f"a key named {key.name!r} exists; rotate or revoke it", param="name")
        stored = {"key": _stored_fields(key), "secrets": [{"sha256": digest, "until": None}]}
        entry = orjson.dumps(stored | {"created_at": time.time()})
        if not await self._store.put_key(key.name, entry, replacing=existing):
            raise KeyConflict(
                f"a key named {key.name!r} was made at the same time; list the keys", param="name"
            )
        await self._keys.refresh()
        return _view(key, "admin") | {"secret": secret}

    async def rotate(self, name: str, overlap: Any) -> dict[str, Any]:
        if (
            isinstance(overlap, bool)
            or not isinstance(overlap, int | float)
            or not 0 <= overlap <= MAX_OVERLAP_S
        ):
            raise InvalidRequest(f"'overlap_s' must be from 0 to {MAX_OVERLAP_S}", param="overlap_s")
        if name in self._keys.configured_names:
            raise KeyConflict(f"{name!r} is written in auth.keys: rotate it in the file", param="name")
        raw, stored = await _made(self._store, name)
        secret, digest = _new_secret()
        now = time.time()
        until = now + float(overlap)
        old = [s | {"until": min(until, s["until"] or until)} for s in stored["secrets"]]
        stored["secrets"] = [{"sha256": digest, "until": None}, *(s for s in old if s["until"] > now)]
        if not await self._store.put_key(name, orjson.dumps(stored), replacing=raw):  # one rotation wins
            raise KeyConflict(f"the key {name!r} changed while it was rotated; rotate it again", param="name")
        await self._keys.refresh()
        key = stored_key(stored)  # the new secret is first
        return _view(key, "admin") | {"secret": secret, "old_secrets_valid_until": until}

    async def revoke(self, name: str) -> dict[str, Any]:
        raw = (await self._store.made_keys()).get(name)
        if name not in self._keys.configured_names:
            raw, _ = await _made(self._store, name)
        if not await self._store.put_key(
            name, orjson.dumps({"revoked": True, "at": time.time()}), replacing=raw
        ):
            raise KeyConflict(f"the key {name!r} changed while it was revoked; revoke it again", param="name")
        await self._keys.refresh()
        return {"name": name, "revoked": True}


def _new_secret() -> tuple[str, str]:
    """A new key (shown once) and its SHA-256 digest (kept)."""
    secret = "tg-" + secrets.token_urlsafe(32)
    return secret, hashlib.sha256(secret.encode()).hexdigest()


async def _made(store: KeyStore, name: str) -> tuple[bytes, dict[str, Any]]:
    """A made key's stored entry, as stored and parsed."""
    raw = (await store.made_keys()).get(name)
    stored: dict[str, Any] | None = orjson.loads(raw) if raw is not None else None
    if raw is None or stored is None or stored.get("revoked"):
        raise KeyNotFound(f"no key named {name!r}", param="name")
    return raw, stored


def _validated(fields: dict[str, Any], config: GatewayConfig) -> KeyConfig:
    """A new key's fields, as JSON gives them: strictly (`rpm: true` or `"60"` is not 60), and
    alive (an `expires_at` already past would make a key nobody can use)."""
    try:
        key = KeyConfig.model_validate_json(orjson.dumps(fields), strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidRequest(f"{where}: {first['msg']}", param=where) from None
    if key.expires_at is not None and key.expires_at.timestamp() <= time.time():
        raise InvalidRequest("expires_at: the time is already past", param="expires_at")
    unknown = sorted(set(key.models or ()) - set(config.models))
    if unknown:
        raise InvalidRequest(f"models: {unknown[0]!r} is not a configured model", param="models")
    return key


def _stored_fields(key: KeyConfig) -> dict[str, Any]:
    return key.model_dump(mode="json", include=set(_FIELDS))


def _view(key: KeyConfig, source: str) -> dict[str, Any]:
    return _stored_fields(key) | {"source": source}
