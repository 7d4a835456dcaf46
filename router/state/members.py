"""What a gateway replica tells the store about a DNS pool (router/fleet/), and the one
assignment rule both stores keep: every replica puts a replica address on the same slot set."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sighting:
    """One replica's resolution of a pool's name, just now."""

    pool: str  # the pool's entry name; its slot sets are routes `pool-0`, `pool-1`, ...
    addresses: tuple[str, ...]  # the addresses the name resolved to
    slots: int  # slot sets the pool has (max_replicas)
    busy: frozenset[int]  # slot sets that hold leases now: never freed
    forget_after_s: float  # an address nobody has resolved this long leaves its slot set


@dataclass(frozen=True, slots=True)
class Assignment:
    held: dict[int, str]  # slot set -> the address on it
    last_seen: dict[str, float]  # address on a slot set -> when a replica last resolved it


def assign(before: Assignment, sighting: Sighting, now: float) -> Assignment:
    """The pool's slot sets after `sighting` at `now` (the store's clock). Kept: an address
    seen now, seen within `forget_after_s`, or on a busy slot set. New addresses take the
    lowest free slot sets in the order given; one that finds none waits for a later sighting."""
    seen = set(sighting.addresses)
    held: dict[int, str] = {}
    for slot, address in before.held.items():
        recent = now - before.last_seen.get(address, float("-inf")) <= sighting.forget_after_s
        if slot < sighting.slots and (address in seen or recent or slot in sighting.busy):
            held[slot] = address
    placed = set(held.values())
    free = iter([slot for slot in range(sighting.slots) if slot not in held])
    for address in dict.fromkeys(sighting.addresses):
        if address not in placed:
            taken = next(free, None)
            if taken is None:
                break
            held[taken] = address
    kept = set(held.values())
    last_seen = {a: t for a, t in before.last_seen.items() if a in kept}
    last_seen.update((a, now) for a in sighting.addresses if a in kept)
    return Assignment(held, last_seen)
