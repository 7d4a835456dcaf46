"""The base of every config section: frozen (a config never changes once loaded) and strict
(an unknown key is an error that names it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
