"""The hedge race (router/request/hedge.py) and its share cap. The property: whatever order the two
attempts answer or fail in, and wherever the request is cancelled, at most one answer is
returned, every other answer is discarded exactly once (its slot released), and no attempt is
left running."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass

import pytest

from router.config import HedgeConfig
from router.request.budget import hedge_budget
from router.request.hedge import race


@dataclass
class Answer:
    name: str
    discarded: int = 0


class Failed(Exception):
    pass


async def attempt(name: str, turns: int, answers: bool, made: list[Answer], running: set[str]) -> Answer:
    """Answers (or fails) after `turns` event-loop turns."""
    running.add(name)
    try:
        for _ in range(turns):
            await asyncio.sleep(0)
        if not answers:
            raise Failed(name)
        made.append(Answer(name))
        return made[-1]
    finally:
        running.discard(name)


async def discard(answer: Answer) -> None:
    await asyncio.sleep(0)  # an await inside the discard, as closing a response has
    answer.discarded += 1


CASES = list(
    itertools.product(range(4), (True, False), range(4), (True, False), (None, *range(7)), (True, False))
)


@pytest.mark.parametrize(("p_turns", "p_ok", "h_turns", "h_ok", "cancel_at", "hedge_allowed"), CASES)
async def test_no_schedule_leaves_an_answer_open(p_turns, p_ok, h_turns, h_ok, cancel_at, hedge_allowed):
    made: list[Answer] = []
    running: set[str] = set()
    sent = asyncio.Event()
    sent.set()  # the primary's request is out: the hedge may start after after_s = 0

    def start_hedge():
        return attempt("hedge", h_turns, h_ok, made, running) if hedge_allowed else None

    async def request():  # the attempt is made once the request runs, as the dispatcher does
        return await race(attempt("primary", p_turns, p_ok, made, running), sent, 0.0, start_hedge, discard)

    task = asyncio.create_task(request())
    if cancel_at is not None:
        for _ in range(cancel_at):
            await asyncio.sleep(0)
        task.cancel()
    returned: Answer | None = None
    try:
        result = await task
        returned = result.answer
        assert hedge_allowed or not result.hedged
        assert result.hedge_won == (returned.name == "hedge")
    except (Failed, asyncio.CancelledError):
        pass
    for _ in range(50):  # the losers' cancellation and the discards run in the background
        if not running and all(a.discarded or a is returned for a in made):
            break
        await asyncio.sleep(0)
    assert not running  # no attempt left running
    for answer in made:
        assert answer.discarded == (0 if answer is returned else 1), (answer, returned)
    if p_ok and cancel_at is None:
        assert returned is not None  # a primary that answers is never lost to the race


async def test_both_failing_raises_the_primarys_failure():
    made: list[Answer] = []
    sent = asyncio.Event()
    sent.set()
    with pytest.raises(Failed, match="primary"):
        await race(
            attempt("primary", 2, False, made, set()),
            sent,
            0.0,
            lambda: attempt("hedge", 1, False, made, set()),
            discard,
        )


async def test_no_hedge_starts_before_the_primarys_request_is_sent():
    sent = asyncio.Event()  # never set: the primary is still waiting for a slot
    started: list[str] = []

    def start_hedge():
        started.append("hedge")
        return None

    result = await race(attempt("primary", 20, True, [], set()), sent, 0.0, start_hedge, discard)
    assert result.answer.name == "primary" and not result.hedged
    assert started == []


def test_the_share_caps_hedges_per_window_and_forgets_old_ones():
    share = hedge_budget(HedgeConfig(after_ms=100, max_percent=10, window_s=10, min_hedges=0))
    for _ in range(50):
        share.request(now=100.0)
    granted = sum(share.try_spend(now=100.0) for _ in range(20))
    assert granted == 5  # 10% of 50
    for _ in range(50):
        share.request(now=200.0)  # a later window: the old requests and hedges are gone
    assert sum(share.try_spend(now=200.0) for _ in range(20)) == 5


@pytest.mark.parametrize("cancel_turns", [None, 0, 1, 2, 3])
async def test_two_answers_in_the_same_turn_return_one_and_discard_the_other(cancel_turns):
    go = asyncio.Event()
    made: list[Answer] = []
    hedge_started = asyncio.Event()

    async def together(name: str) -> Answer:
        if name == "hedge":
            hedge_started.set()
        await go.wait()  # both woken by one set(): they answer in the same loop turn
        made.append(Answer(name))
        return made[-1]

    sent = asyncio.Event()
    sent.set()

    async def request():
        return await race(together("primary"), sent, 0.0, lambda: together("hedge"), discard)

    task = asyncio.create_task(request())
    await hedge_started.wait()
    go.set()
    if cancel_turns is not None:
        for _ in range(cancel_turns):
            await asyncio.sleep(0)
        task.cancel()
    returned = None
    with contextlib.suppress(asyncio.CancelledError):
        returned = (await task).answer
    for _ in range(50):
        if len(made) == 2 and all(a.discarded or a is returned for a in made):
            break
        await asyncio.sleep(0)
    assert len(made) == 2
    for answer in made:
        assert answer.discarded == (0 if answer is returned else 1), (answer, returned)
    if cancel_turns is None:
        assert returned is not None


async def test_the_loser_is_cancelled_as_soon_as_the_race_is_won():
    running: set[str] = set()
    never = asyncio.Event()

    async def stalled() -> Answer:
        running.add("primary")
        try:
            await never.wait()
            return Answer("primary")
        finally:
            running.discard("primary")

    sent = asyncio.Event()
    sent.set()
    result = await race(stalled(), sent, 0.0, lambda: attempt("hedge", 1, True, [], set()), discard)
    assert result.hedge_won
    for _ in range(3):
        await asyncio.sleep(0)
    assert not running  # cancelled at once, not left to run out its stall


def test_min_hedges_lets_a_quiet_model_hedge_its_first_stall():
    share = hedge_budget(HedgeConfig(after_ms=100, max_percent=5, window_s=10, min_hedges=2))
    share.request(now=0.0)
    assert [share.try_spend(now=0.0) for _ in range(3)] == [True, True, False]
