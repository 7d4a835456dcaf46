"""What an acquire asks of a dedicated pool, and the lease it gets (router/state/roles.py
states the contract every store keeps)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Slots:
    """What an acquire asks of a pool: `capacity` slots in all, `weight` of them for this
    request (its `n`/`best_of` engine sequences), and a line of at most `max_waiters`."""

    capacity: int
    weight: int = 1
    max_waiters: int = 64
    # predicted-TTFT admission: this request's prompt tokens, counted as pending prefill on the
    # pool until its first token; admitted only while the pool's pending tokens with these stay
    # within `max_pending_tokens` (or the pool has none pending: a lone prompt always fits)
    prompt_tokens: int = 0
    max_pending_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    """One admitted request's `weight` slots on a dedicated pool."""

    pool: str
    token: str
    weight: int = 1
    prompt_tokens: int = 0  # pending prefill on the pool until `prefilled` or `release`
    pending_at_admit: int = 0  # the pool's pending prompt tokens right after this admission


def members(token: str, weight: int) -> list[str]:
    """The slot members a lease of `weight` holds under `token` (the token itself first)."""
    return [token, *(f"{token}#{i}" for i in range(2, weight + 1))]
