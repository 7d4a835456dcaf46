"""A connection's one deadline on one loop timer (router/http/deadline.py): what is armed last
is what runs, at or after its time, once; what is disarmed never runs."""

from __future__ import annotations

import asyncio

from router.http.deadline import Deadline


async def _until(event: asyncio.Event) -> None:
    async with asyncio.timeout(10):  # a bound, not a measurement: a fire comes well before it
        await event.wait()


async def test_the_last_deadline_armed_runs_once_and_no_earlier_than_asked():
    loop = asyncio.get_running_loop()
    ran: list[tuple[str, float]] = []
    done = asyncio.Event()
    deadline = Deadline(loop)
    deadline.arm(0.01, lambda: ran.append(("early", loop.time())))
    armed = loop.time()
    deadline.arm(0.2, lambda: (ran.append(("late", loop.time())), done.set()))  # moved later
    await _until(done)
    assert [name for name, _ in ran] == ["late"]
    assert ran[0][1] >= armed + 0.2 - 1e-3  # the loop timer fired early and waited again


async def test_an_earlier_deadline_replaces_a_later_one():
    loop = asyncio.get_running_loop()
    ran: list[str] = []
    done = asyncio.Event()
    deadline = Deadline(loop)
    deadline.arm(30, lambda: ran.append("later"))
    deadline.arm(0.01, lambda: (ran.append("sooner"), done.set()))
    await _until(done)
    assert ran == ["sooner"]


async def test_a_disarmed_or_stopped_deadline_never_runs():
    loop = asyncio.get_running_loop()
    ran: list[str] = []
    deadline = Deadline(loop)
    deadline.arm(0.01, lambda: ran.append("disarmed"))
    deadline.disarm()
    stopped = Deadline(loop)
    stopped.arm(0.01, lambda: ran.append("stopped"))
    stopped.stop()
    witness, done = Deadline(loop), asyncio.Event()
    witness.arm(0.05, done.set)  # armed after both, for longer: it fires after they would have
    await _until(done)
    assert ran == []
