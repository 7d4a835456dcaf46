"""Tasks: the denominator of cost per successful task.

A task is one request, or every request a client sent with the same `x-tidegate-task-id`
(an agent's steps, the application's own retries). It succeeds when its last request
succeeded (router/record/success.py) and no `POST /v1/feedback` marked it failed. A task counts on
the route of its last request: each settled request moves the task's `tasks`/`tasks_ok`
counters there, as deltas in the route's shared counters, so every replica's report agrees.

A task belongs to the caller (API key) that made it: a request that is its own task is named
by its request id (random, unguessable), a task the client named lives in its caller's
namespace (`key-.../t:checkout-42`), so two keys' `checkout-42` are two tasks. Feedback is
applied only from the owner (or the admin key). Failure feedback that arrives before its
task was settled is kept for `tasks.early_feedback_s`, at most `tasks.max_early_feedback`
per caller (past that: 429), and never displaces a real task.

The state store keeps each task's (route, ok, failed) for `tasks.ttl_s` and applies each
change atomically (`settle_task`, `task_feedback`); this module turns the state it returns
into counter deltas. Settling runs in the background, after the answer was sent: a queue of
at most `_MAX_PENDING` requests. When the queue is full or the store cannot be reached the
request still counts, as a task of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Mapping

from router.state.latency import Counts
from router.state.roles import Samples, Tasks
from router.state.tasks import EarlyBound, Feedback, FeedbackResult, Settlement, TaskState

log = logging.getLogger("tidegate")

_MAX_PENDING = 10_000
_WARN_EVERY_S = 30.0
_BATCH = 256


DEFAULT_EARLY = EarlyBound()
_TASK_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def valid_task_id(text: str) -> bool:
    """A client's task id: 1 to 128 of [A-Za-z0-9._:-], nothing else (no trailing newline)."""
    return _TASK_ID.fullmatch(text) is not None


def task_name(owner: str, task: str, request: str) -> str:
    """The store's name of a task: a request that is its own task by its request id; a task
    the client named within its owner's namespace."""
    return request if task == request else f"{owner}/{task}"


def settle_deltas(before: TaskState, route: str, ok: bool) -> dict[str, Counts]:
    now_ok = ok and not before.failed
    deltas: dict[str, Counts] = {}
    if before.route:
        deltas[before.route] = {"tasks": -1, "tasks_ok": -float(before.ok)}
    moved = deltas.setdefault(route, {})
    moved["tasks"] = moved.get("tasks", 0) + 1
    moved["tasks_ok"] = moved.get("tasks_ok", 0) + float(now_ok)
    moving = {r: {k: v for k, v in c.items() if v} for r, c in deltas.items()}
    return {r: c for r, c in moving.items() if c}


def feedback_deltas(before: TaskState, ok: bool) -> dict[str, Counts]:
    if not before.route:
        return {}  # not settled yet: the settle will see the mark
    if ok:
        return {before.route: {"feedback_ok": 1}}
    if before.failed:
        return {}  # marked before: nothing moves twice
    counts: Counts = {"feedback_failed": 1}
    if before.ok:
        counts["tasks_ok"] = -1
    return {before.route: counts}


class TaskLedger:
    """Settles finished requests into their tasks in the background; takes feedback."""

    def __init__(
        self,
        store: Tasks,
        samples: Samples,
        ttl_s: float,
        *,
        on_settled: Callable[[str, str], None] | None = None,
        early: EarlyBound = DEFAULT_EARLY,
    ) -> None:
        """`on_settled(route, result)` hears of each new task settled (success or failure) and
        each task feedback failed (feedback_failed): the Prometheus tasks counter."""
        self._store, self._samples = store, samples
        self._on_settled = on_settled
        self._ttl_s = ttl_s
        self._early = early
        self._pending: deque[Settlement] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()  # nothing queued or being settled
        self._idle.set()
        self._runner: asyncio.Task[None] | None = None
        self.untracked = 0  # requests counted as tasks of their own (queue full, store away)
        self._warned_at = -_WARN_EVERY_S

    def settle_later(
        self, task: str, request: str, route: str, ok: bool, owner: str, *, started_s: float = 0.0
    ) -> None:
        """`task`: the client's task id (`t:...`), or the request id for a task of its own;
        `started_s`: when the request arrived (Unix s): the task goes by its last arrival."""
        if len(self._pending) >= _MAX_PENDING:
            self._count_alone(route, ok)
            return
        name = task_name(owner, task, request)
        self._pending.append(Settlement(name, request, route, ok, owner, int(started_s * 1000)))
        self._idle.clear()
        self._wake.set()

    async def feedback(self, key: str, ok: bool, caller: str | None) -> Feedback:
        """Apply `caller`'s feedback (None: the admin's) on a request id or a task name."""
        found = await self._store.task_feedback(key, ok, caller, self._ttl_s, self._early)
        if found.result is FeedbackResult.APPLIED:
            before = found.before
            self._apply(feedback_deltas(before, ok))
            if not ok and not before.failed:
                self._tell(before.route, "feedback_failed")
        return found

    def start(self) -> None:
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Settle what is queued (bounded by 2 s), then stop."""
        if self._runner is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                while self._pending:
                    await self._settle(self._take())
        self._runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._runner
        self._runner = None
        for item in self._pending:
            self._count_alone(item.route, item.ok)
        self._pending.clear()

    async def drained(self) -> None:
        """Wait until everything queued so far is settled (tests, shutdown)."""
        await self._idle.wait()

    async def _run(self) -> None:
        """Settle what is queued, whenever something is; a fault of ours in one batch is
        logged and its requests counted on their own (never lost), and the runner goes on."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = self._take()
                try:
                    await self._settle(batch)
                except Exception:
                    log.exception("task ledger: a batch of %d could not be settled", len(batch))
                    for item in batch:
                        self._count_alone(item.route, item.ok)
            self._idle.set()

    def _take(self) -> list[Settlement]:
        return [self._pending.popleft() for _ in range(min(_BATCH, len(self._pending)))]

    async def _settle(self, batch: list[Settlement]) -> None:
        """One batch at once: a Redis store sends them in one pipeline."""
        states = await self._states(batch)
        for item, state in zip(batch, states, strict=True):
            if isinstance(state, TaskState):
                if state.superseded:  # a later request of the task settled first: it stays there
                    self._apply(settle_deltas(state, state.route, state.ok))
                    continue
                self._apply(settle_deltas(state, item.route, item.ok))
                if not state.route:
                    self._tell(item.route, "success" if item.ok and not state.failed else "failure")
            else:
                if not isinstance(state, Exception):
                    raise state
                self._warn(state)
                self._count_alone(item.route, item.ok)

    async def _states(self, batch: list[Settlement]) -> list[TaskState | BaseException]:
        """Each settlement's state, or the exception it raised. A batch of one (the usual one
        below a few hundred requests a second) is awaited as it is: a task and a gathering
        future for it cost more than its settling in the memory store."""
        if len(batch) == 1:
            try:
                return [await self._store.settle_task(batch[0], self._ttl_s)]
            except Exception as exc:
                return [exc]
        return await asyncio.gather(
            *(self._store.settle_task(s, self._ttl_s) for s in batch), return_exceptions=True
        )

    def _warn(self, error: Exception) -> None:
        """One line per _WARN_EVERY_S while the store fails, not one per request."""
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "tasks not settled in the store (%s): each counted as a task of its own; %d so far",
                error,
                self.untracked + 1,
            )

    def _tell(self, route: str, result: str) -> None:
        if self._on_settled is not None:
            self._on_settled(route, result)

    def _count_alone(self, route: str, ok: bool) -> None:
        self.untracked += 1
        self._tell(route, "success" if ok else "failure")
        self._apply({route: {"tasks": 1, "tasks_ok": float(ok)}})

    def _apply(self, deltas: Mapping[str, Counts]) -> None:
        for route, counts in deltas.items():
            if counts:
                self._samples.count(route, counts)
