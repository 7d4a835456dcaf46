"""Client keys as tenants (docs/tenants.md): a name, a team, a priority class, the models it
may use, its rate limits and budgets, and when it expires. Written in `auth.keys`, or created
through the admin API (`tidegate keys create`), which stores the same fields with the key's
digest in the state store."""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from router.config.frozen import Frozen

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class Priority(StrEnum):
    INTERACTIVE = "interactive"  # waits for nobody: dedicated first, then spills
    BATCH = "batch"  # fills idle dedicated capacity behind every interactive request; never spills by default


class KeyConfig(Frozen):
    """One client key. The secret is `key` (from a `${ENV}` reference: the loader refuses a
    plain-text one) or `key_sha256` (its SHA-256 digest, hex): never the secret in the file."""

    name: Annotated[str, Field(pattern=NAME)]  # the caller's name in records, tasks and reports
    team: Annotated[str, Field(pattern=NAME)] = "default"  # spend and successes are reported per team
    key: str = ""  # a ${VAR} reference to the secret (never the secret itself)
    key_sha256: str = ""  # or the secret's hex SHA-256
    # batch: waits for idle dedicated slots, never spills (docs/tenants.md)
    priority: Priority = Priority.INTERACTIVE
    models: Annotated[tuple[str, ...], Field(min_length=1)] | None = None  # none: every model; [] is refused
    rpm: Annotated[int, Field(ge=1)] | None = None  # requests per minute, across every replica
    tpm: Annotated[int, Field(ge=1)] | None = None  # tokens (prompt + answer) per minute
    max_usd_per_day: Annotated[float, Field(ge=0)] | None = None  # UTC day
    max_usd_per_month: Annotated[float, Field(ge=0)] | None = None  # UTC calendar month
    expires_at: datetime | None = None  # after this the key is refused (401)

    @field_validator("key_sha256")
    @classmethod
    def _hex(cls, digest: str) -> str:
        digest = digest.lower()
        if digest and not _HEX64.match(digest):
            raise ValueError("key_sha256 must be 64 hex digits (sha256sum of the key)")
        return digest

    @field_validator("expires_at")
    @classmethod
    def _aware(cls, at: datetime | None) -> datetime | None:
        if at is not None and at.tzinfo is None:
            raise ValueError("expires_at needs a time zone, e.g. 2027-01-01T00:00:00Z")
        return at

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name in ("admin", "anonymous") or name.startswith("key-"):
            raise ValueError(f"{name!r} is reserved (admin, anonymous and key-* name other callers)")
        return name

    @model_validator(mode="after")
    def _one_secret(self) -> KeyConfig:
        if bool(self.key) == bool(self.key_sha256):
            raise ValueError(f"key {self.name}: give key (a ${{ENV}} reference) or key_sha256, exactly one")
        return self
