"""Hedging a slow first token (issue 18): when a stream's dedicated attempt has no first event
`after_ms` after it was sent, its serverless attempt starts too, and the first of the two to
produce a first event is the answer.

The race is settled by a claim, not by which task the loop happens to wake first: an attempt
that returns its answer claims the race in the same step (nothing can run in between), and an
attempt that returns after the race was claimed, or after the request was abandoned, discards
its own answer (closes its upstream response, releases its slot) instead of returning it. The
loser still running is cancelled at once; its own cleanup gives its slot back. So no answer is
ever left open, whichever order the two finish in and wherever the request is cancelled.

A request never hedges after a byte reached the client: the dispatcher answers the client only
with the race's winner, and an attempt's answer exists only once its first event arrived.

The dispatcher caps hedges with a share budget (router/request/budget.py `hedge_budget`): at most
`max_percent` of the model's requests over `window_s`, per process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

A = TypeVar("A")  # an attempt's answer

_background: set[asyncio.Task[Any]] = set()  # losers finishing their cleanup


class Lost(Exception):
    """Raised by an attempt that answered after the race was settled (its answer discarded)."""


@dataclass(slots=True)
class Result(Generic[A]):
    answer: A
    hedged: bool  # whether the hedge was started
    hedge_won: bool  # whether the hedge's answer is the one returned


@dataclass(slots=True)
class _Race:
    settled: bool = False


async def race(
    primary: Coroutine[Any, Any, A],
    sent: asyncio.Event,
    after_s: float,
    start_hedge: Callable[[], Coroutine[Any, Any, A] | None],
    discard: Callable[[A], Awaitable[None]],
) -> Result[A]:
    """`primary`'s answer, or the hedge's when `primary` has none `after_s` after `sent` is
    set (its request went out) and `start_hedge()` gives a hedge (None: not this time). The
    first answer wins and the other attempt is cancelled. When both fail, `primary`'s failure
    is raised (the dispatcher's retries go on from there)."""
    state = _Race()

    async def claiming(attempt: Coroutine[Any, Any, A]) -> A:
        answer = await attempt
        if state.settled:  # the other won, or the request was abandoned: nobody takes this
            _discard_later(discard, answer)  # in a task of its own: this one is being cancelled
            raise Lost
        state.settled = True
        return answer

    first = _start(claiming(primary), primary)
    tasks = [first]
    winner: asyncio.Task[A] | None = None
    try:
        await _until_sent_then(first, sent, after_s)
        if first.done() or (hedge := start_hedge()) is None:
            winner = first
            return Result(await first, hedged=False, hedge_won=False)
        second = _start(claiming(hedge), hedge)
        tasks.append(second)
        pending = {first, second}
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and task.exception() is None:
                    winner = task
                    return Result(task.result(), hedged=True, hedge_won=task is second)
        return Result(await first, hedged=True, hedge_won=False)  # both failed: raises the primary's
    finally:
        state.settled = True  # an answer still on its way discards itself
        for task in tasks:
            if not task.done():
                task.cancel()
                _keep(task)
            elif task is not winner and not task.cancelled() and task.exception() is None:
                # answered, but the request was cancelled before it could take the answer
                _discard_later(discard, task.result())


def _start(claim: Coroutine[Any, Any, A], attempt: Coroutine[Any, Any, A]) -> asyncio.Task[A]:
    """`claim` as a task; an attempt cancelled before it ever ran is closed, not left unawaited."""
    task = asyncio.create_task(claim)
    task.add_done_callback(lambda _: attempt.close())  # a no-op once it ran to its end
    return task


def _discard_later(discard: Callable[[A], Awaitable[None]], answer: A) -> None:
    """Discard `answer` in a task nobody cancels (a cancelled task's shielded await is still
    interrupted by a second `cancel()`)."""
    _keep(asyncio.get_running_loop().create_task(_run(discard(answer))))


async def _run(awaitable: Awaitable[None]) -> None:
    await awaitable


def _keep(task: asyncio.Task[Any]) -> None:
    _background.add(task)
    task.add_done_callback(_forget)


async def _until_sent_then(first: asyncio.Task[Any], sent: asyncio.Event, after_s: float) -> None:
    """Return when `first` is done, or `after_s` after `sent` was set, whichever is sooner."""
    waiter = asyncio.create_task(sent.wait())
    try:
        await asyncio.wait({first, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if not first.done():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(first), after_s)


def _forget(task: asyncio.Task[Any]) -> None:
    _background.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: a loser's failure is not an unhandled-task warning
