"""The members role: every gateway replica puts a DNS pool's addresses on the same slot sets;
an address keeps its slot set while anyone resolves it or it holds leases, and a slot set freed
after `forget_after_s` goes to the next new address."""

from __future__ import annotations

import time

from router.state.members import Sighting
from tests.contracts.pair import Pair


def _seen(*addresses: str, slots: int = 3, busy: frozenset[int] = frozenset(), forget: float = 60.0) -> Sighting:
    return Sighting("pool", addresses, slots, busy, forget)


async def _until_freed(pair: Pair, sighting: Sighting, address: str) -> dict[int, str]:
    """Claim `sighting` until `address` has left its slot set (a deadline, not a sleep)."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        held = await pair.peer.members.claim(sighting)
        if address not in held.values():
            return held
    raise AssertionError(f"{address} kept its slot set past the deadline")


async def check_every_replica_puts_an_address_on_the_same_slot_set(pair: Pair) -> None:
    assert await pair.store.members.claim(_seen("10.0.0.1", "10.0.0.2")) == {0: "10.0.0.1", 1: "10.0.0.2"}
    # the peer resolved them in another order, and one more: the first two stay where they are
    found = await pair.peer.members.claim(_seen("10.0.0.3", "10.0.0.2", "10.0.0.1"))
    assert found == {0: "10.0.0.1", 1: "10.0.0.2", 2: "10.0.0.3"}
    assert await pair.store.members.claim(_seen("10.0.0.1")) == found  # seen by the peer just now


async def check_an_address_nobody_resolves_is_freed_and_its_slot_set_reused(pair: Pair) -> None:
    await pair.store.members.claim(_seen("10.0.0.1", "10.0.0.2"))
    held = await _until_freed(pair, _seen("10.0.0.2", forget=0.0), "10.0.0.1")
    assert held == {1: "10.0.0.2"}
    assert await pair.store.members.claim(_seen("10.0.0.2", "10.0.0.9")) == {0: "10.0.0.9", 1: "10.0.0.2"}


async def check_a_slot_set_holding_leases_keeps_its_address(pair: Pair) -> None:
    await pair.store.members.claim(_seen("10.0.0.1", "10.0.0.2"))
    started = time.monotonic()
    while time.monotonic() - started < 0.05:  # long past forget_after_s, every claim says so
        held = await pair.peer.members.claim(_seen("10.0.0.2", busy=frozenset({0}), forget=0.0))
        assert held == {0: "10.0.0.1", 1: "10.0.0.2"}
    assert await _until_freed(pair, _seen("10.0.0.2", forget=0.0), "10.0.0.1") == {1: "10.0.0.2"}


async def check_more_replicas_than_slot_sets_wait_for_one(pair: Pair) -> None:
    three = _seen("10.0.0.1", "10.0.0.2", "10.0.0.3", slots=2)
    assert await pair.store.members.claim(three) == {0: "10.0.0.1", 1: "10.0.0.2"}
    held = await _until_freed(pair, _seen("10.0.0.1", "10.0.0.3", slots=2, forget=0.0), "10.0.0.2")
    assert held == {0: "10.0.0.1", 1: "10.0.0.3"}


async def check_fewer_slot_sets_drop_the_ones_beyond(pair: Pair) -> None:
    await pair.store.members.claim(_seen("10.0.0.1", "10.0.0.2", "10.0.0.3"))
    assert await pair.peer.members.claim(_seen("10.0.0.1", "10.0.0.2", slots=2)) == {
        0: "10.0.0.1",
        1: "10.0.0.2",
    }
