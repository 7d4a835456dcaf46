"""The spend role: a ledger takes a spend only within its cap, atomically; a settle gives back
what a reservation over-counted; a ledger ends with its time to live."""

from __future__ import annotations

import asyncio
import time

from tests.contracts.pair import Pair


async def check_a_ledger_spends_within_its_cap_only(pair: Pair) -> None:
    assert await pair.store.spend.try_spend("day", 0.625, 1.0, 60.0)  # sums exact in binary
    assert not await pair.peer.spend.try_spend("day", 0.5, 1.0, 60.0)  # 1.125 would pass the cap
    assert await pair.peer.spend.try_spend("day", 0.375, 1.0, 60.0)
    assert not await pair.store.spend.try_spend("other", 2.0, 1.0, 60.0)  # alone over it
    assert await pair.store.spend.try_spend("other", 1.0, 1.0, 60.0)


async def check_a_settle_gives_back_what_was_over_reserved(pair: Pair) -> None:
    assert await pair.store.spend.try_spend("day", 0.875, 1.0, 60.0)
    assert not await pair.peer.spend.try_spend("day", 0.5, 1.0, 60.0)
    await pair.store.spend.settle_spend("day", -0.625)  # it cost 0.25
    assert await pair.peer.spend.try_spend("day", 0.5, 1.0, 60.0)


async def check_races_never_pass_the_cap(pair: Pair) -> None:
    spends = [pair.store.spend.try_spend("race", 0.125, 1.0, 60.0) for _ in range(15)]
    spends += [pair.peer.spend.try_spend("race", 0.125, 1.0, 60.0) for _ in range(15)]
    assert sum(await asyncio.gather(*spends)) == 8


async def check_a_ledger_ends_with_its_time_to_live(pair: Pair) -> None:
    assert await pair.store.spend.try_spend("short", 1.0, 1.0, 0.2)
    deadline = time.monotonic() + 5.0
    while not await pair.peer.spend.try_spend("short", 1.0, 1.0, 0.2):
        assert time.monotonic() < deadline, "the ledger never ended"
        await asyncio.sleep(0.05)
