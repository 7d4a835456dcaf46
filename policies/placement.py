"""Placement: which of a model's dedicated replicas a request tries first.

A model's dedicated endpoints are replicas of one engine: each with its own queue and its own
prefix cache. The placer orders them, best first; serverless candidates keep their place after
them, and the picker still skips a full replica (so `saturated` means the whole pool was full).

`scored` (the default) ranks a replica by when the request would start there and what it would
cost: the prompt tokens waiting for prefill on it (every gateway replica's, from the store, or
its engine's own queue when that says more), counted in lengths of this request's prompt, so a
replica behind one long prefill is as busy as one behind many short ones; plus its load
(leases held, requests in line and in its engine's queue, per slot: `load_weight`); less the
share of the prompt's prefix it probably holds in cache (`prefix_weight`: at 1, a cached token
counts exactly as a token it need not compute, in the same units as the tokens ahead) and a
bonus for being the request's session home (`session_weight`). The prefix shares come from the
gateway's index of what it sent where (router/request/placement.py); the session home and the
tie-break are rendezvous hashes, so every gateway replica agrees without sharing state, and a
replica joining or leaving moves only its own share of the sessions. `least_loaded`,
`round_robin` and `listed` (the first replica with room, in listed order) are there to compare
against and for operators who want them.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from policies.base import Placed, RequestContext
from policies.predicted_ttft import tokens_ahead
from policies.types import Snapshot, T, Target, is_dedicated

NO_PLACEMENT: Mapping[str, Placed] = MappingProxyType({})


class Placement(StrEnum):
    SCORED = "scored"
    LEAST_LOADED = "least_loaded"
    ROUND_ROBIN = "round_robin"
    LISTED = "listed"


@dataclass(frozen=True, slots=True)
class Weights:
    """A replica's score is the prompt tokens ahead of the request there, in prompts of its
    length, plus `load` x its busy share per slot, less `prefix` x the share of the prompt's
    prefix it holds, less `session` when it is the session's home: lowest first."""

    load: float = 1.0
    prefix: float = 1.0
    session: float = 0.3


def load_per_slot(snapshot: Snapshot, replica: Target) -> float:
    """Leases held, requests in line and the engine's own waiting queue, per slot."""
    slots = replica.max_concurrency or 1
    engine = snapshot.engine_queue.get(replica.name)
    busy = snapshot.in_flight.get(replica.name, 0) + snapshot.waiting.get(replica.name, 0)
    return (busy + (engine.waiting if engine is not None else 0.0)) / slots


def is_full(snapshot: Snapshot, replica: Target) -> bool:
    """Every slot of `replica` is held (as of the snapshot)."""
    return snapshot.in_flight.get(replica.name, 0) >= (replica.max_concurrency or 1)


def prompts_ahead(snapshot: Snapshot, replica: Target, prompt_tokens: int) -> float:
    """The prompt tokens waiting for prefill on `replica`, in prompts of `prompt_tokens`: how
    many of this request's own prefill it would wait behind there."""
    return tokens_ahead(snapshot, replica.name, prompt_tokens) / max(1, prompt_tokens)


def rendezvous(key: str, name: str) -> int:
    """The weight of `name` for `key` (highest random weight hashing): stable across processes."""
    digest = hashlib.blake2b(f"{key}\x00{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Placer:
    """Orders a decision's dedicated candidates; see the module docstring. Pure but for
    `round_robin`'s counter, which is this gateway process's own."""

    def __init__(self, placement: Placement = Placement.SCORED, weights: Weights = Weights()) -> None:
        self._placement = placement
        self._weights = weights
        self._turn = itertools.count()

    def place(
        self, context: RequestContext, snapshot: Snapshot, candidates: tuple[T, ...]
    ) -> tuple[tuple[T, ...], Mapping[str, Placed]]:
        """The candidates with the dedicated ones best first, and why each dedicated replica
        stands where it does (empty with fewer than two: there was nothing to choose)."""
        dedicated = [c for c in candidates if is_dedicated(c)]
        if len(dedicated) < 2:
            return candidates, NO_PLACEMENT
        others = tuple(c for c in candidates if not is_dedicated(c))
        if self._placement is Placement.LISTED:
            return candidates, dict.fromkeys((d.name for d in dedicated), Placed.LISTED)
        if self._placement is Placement.ROUND_ROBIN:
            turn = next(self._turn) % len(dedicated)
            ranked = [*dedicated[turn:], *dedicated[:turn]]
            return (*ranked, *others), dict.fromkeys((d.name for d in dedicated), Placed.ROUND_ROBIN)
        tie = context.session or context.placement_key or context.stickiness_key or ""
        if self._placement is Placement.LEAST_LOADED:
            ranked = sorted(dedicated, key=lambda d: (load_per_slot(snapshot, d), -rendezvous(tie, d.name)))
            return (*ranked, *others), dict.fromkeys((d.name for d in dedicated), Placed.LEAST_LOADED)
        return self._scored(context, snapshot, dedicated, others, tie)

    def _scored(
        self, context: RequestContext, snapshot: Snapshot, dedicated: list[T], others: tuple[T, ...], tie: str
    ) -> tuple[tuple[T, ...], Mapping[str, Placed]]:
        weights, hits = self._weights, context.prefix_hits
        home = _session_home(context.session, dedicated) if weights.session > 0 else None
        scores = {
            d.name: prompts_ahead(snapshot, d, context.prompt_tokens)
            + weights.load * load_per_slot(snapshot, d)
            - weights.prefix * hits.get(d.name, 0.0)
            - (weights.session if d.name == home else 0.0)
            for d in dedicated
        }
        # a replica with no free slot goes after every one with a slot, whatever its score: the
        # first target is where a request waits in line, and a full replica with nothing left to
        # prefill can score below one with a free slot and a prompt in prefill
        ranked = sorted(
            dedicated, key=lambda d: (is_full(snapshot, d), scores[d.name], -rendezvous(tie, d.name))
        )
        return (*ranked, *others), {d.name: _why(d.name, hits, home, weights) for d in dedicated}


def _session_home(session: str | None, dedicated: list[T]) -> str | None:
    if session is None:
        return None
    return max(dedicated, key=lambda d: rendezvous(session, d.name)).name


def _why(name: str, hits: Mapping[str, float], home: str | None, weights: Weights) -> Placed:
    """What put `name` where it stands: its share of the prefix, its being the session's
    home (the larger of the two bonuses), else its load alone."""
    prefix = weights.prefix * hits.get(name, 0.0)
    session = weights.session if name == home else 0.0
    if prefix > 0 and prefix >= session:
        return Placed.PREFIX_AFFINITY
    if session > 0:
        return Placed.SESSION_AFFINITY
    return Placed.LEAST_LOADED
