"""The circuits role: a trip opens a route's circuit for every process, each trip since the
last close twice as long (capped), and a reset closes it everywhere."""

from __future__ import annotations

import time

from tests.contracts.pair import Pair


async def check_a_trip_opens_the_circuit_everywhere_for_its_cooldown(pair: Pair) -> None:
    left = await pair.store.circuits.trip("m/a", cooldown_s=5.0, max_cooldown_s=60.0)
    assert 4.5 <= left <= 5.0
    await pair.sync(pair.peer)
    until = pair.peer.snapshot().circuit_open["m/a"]
    assert 4.0 <= until - time.monotonic() <= 5.0
    assert "m/b" not in pair.peer.snapshot().circuit_open


async def check_each_trip_doubles_the_cooldown_up_to_its_cap(pair: Pair) -> None:
    lefts = [await pair.store.circuits.trip("m/a", cooldown_s=2.0, max_cooldown_s=5.0) for _ in range(4)]
    assert 1.5 <= lefts[0] <= 2.0
    assert 3.5 <= lefts[1] <= 4.0
    assert 4.5 <= lefts[2] <= 5.0 and 4.5 <= lefts[3] <= 5.0


async def check_a_reset_closes_it_everywhere_and_the_next_trip_starts_short(pair: Pair) -> None:
    await pair.store.circuits.trip("m/b", cooldown_s=3.0, max_cooldown_s=30.0)
    await pair.store.circuits.trip("m/b", cooldown_s=3.0, max_cooldown_s=30.0)
    await pair.peer.circuits.reset_circuit("m/b")
    await pair.sync(pair.store)
    assert "m/b" not in pair.store.snapshot().circuit_open
    again = await pair.store.circuits.trip("m/b", cooldown_s=3.0, max_cooldown_s=30.0)
    assert again <= 3.0
