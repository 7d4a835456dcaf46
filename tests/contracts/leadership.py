"""The leadership role: one holder per role at a time, renewable by its holder, handed over
at once by a resignation and by itself when the lease runs out."""

from __future__ import annotations

import asyncio
import time

from tests.contracts.pair import Pair


async def check_one_holder_at_a_time_per_role(pair: Pair) -> None:
    assert await pair.store.leadership.lead("a", 30.0)
    assert await pair.store.leadership.lead("a", 30.0)  # its holder renews it
    assert not await pair.peer.leadership.lead("b", 30.0)
    assert await pair.peer.leadership.lead("b", 30.0, role="keep_warm")  # another role, another lease


async def check_only_the_holder_resigns_and_then_another_leads(pair: Pair) -> None:
    assert await pair.store.leadership.lead("a", 30.0)
    await pair.peer.leadership.resign("b")  # not the holder: nothing changes
    assert not await pair.peer.leadership.lead("b", 30.0)
    await pair.store.leadership.resign("a")
    assert await pair.peer.leadership.lead("b", 30.0)


async def check_a_lease_nobody_renews_ends_by_itself(pair: Pair) -> None:
    assert await pair.store.leadership.lead("a", 0.2)
    deadline = time.monotonic() + 5.0
    while not await pair.peer.leadership.lead("b", 30.0):
        assert time.monotonic() < deadline, "the lease never ran out"
        await asyncio.sleep(0.05)
    assert not await pair.store.leadership.lead("a", 30.0)
