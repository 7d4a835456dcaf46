"""Canary gate: only a model's canary percent of its traffic is eligible for dedicated.

Eligibility is sticky per stickiness key: the key hashes to a bucket in [0, 100) and is
eligible while its bucket is below the percent. Raising the percent therefore only adds
keys to dedicated, never moves an eligible key off it. The live percent comes from the
snapshot (set through the admin API, shared by every replica), else from the percent the
gate was built with (the model's config). A batch request passes the gate when its model
says so (`routing.batch.canary: dedicated`, the default; docs/tenants.md): it waits for a
dedicated slot rather than paying serverless prices for being outside the canary.
"""

from __future__ import annotations

import hashlib

from policies.base import Reason, RequestContext
from policies.pipeline import drop_dedicated
from policies.types import Snapshot, T


def bucket(model: str, key: str) -> float:
    """A stable position of `key` in [0, 100) for `model`, in steps of 0.01."""
    digest = hashlib.blake2b(f"{model}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 10_000 / 100.0


class CanaryGate:
    """A filter: removes dedicated candidates for keys outside the canary (`canary_out`)."""

    def __init__(self, percent: float) -> None:
        self._percent = percent

    def filter(
        self, context: RequestContext, snapshot: Snapshot, candidates: tuple[T, ...]
    ) -> tuple[tuple[T, ...], Reason | None]:
        percent = snapshot.canary_percent.get(context.model, self._percent)
        if percent >= 100 or context.stickiness_key is None or context.canary_exempt:
            return candidates, None
        if bucket(context.model, context.stickiness_key) < percent:
            return candidates, None
        return drop_dedicated(candidates, lambda _: True, Reason.CANARY_OUT)
