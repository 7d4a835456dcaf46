"""Tasks and feedback in one process (router/state/roles.py, `Tasks`): at most `max_tasks`
tasks tracked (the oldest dropped first), and early failure feedback kept apart from them,
bounded per caller, so that it can never push a real task out."""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from dataclasses import replace
from typing import TypeVar

from router.state.tasks import EarlyBound, Feedback, FeedbackResult, Settlement, TaskState

V = TypeVar("V")


class MemoryTasks:
    def __init__(self, max_tasks: int) -> None:
        # task id -> (state, expiry) and request id -> (task id, expiry), oldest first, each
        # at most `max_tasks` long (the oldest entry is dropped first)
        self._tasks: OrderedDict[str, tuple[TaskState, float]] = OrderedDict()
        self._requests: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._max_tasks = max_tasks
        # failure feedback on a task (or request) not settled yet: name -> (caller, until),
        # oldest first
        self._early: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._early_by: Counter[str] = Counter()

    async def settle_task(self, settled: Settlement, ttl_s: float) -> TaskState:
        task, request, route, ok, owner = (
            settled.task,
            settled.request,
            settled.route,
            settled.ok,
            settled.owner,
        )
        now = time.monotonic()
        marked = self._take_early(task, owner, now)
        if request != task:
            marked = self._take_early(request, owner, now) or marked  # both used up
        before = self._live(self._tasks, task, now) or TaskState()
        if marked and not before.failed:
            before = replace(before, failed=True)
        if before.route and before.started_ms > settled.started_ms:  # a later request settled first
            kept = replace(before, ok=before.ok and not before.failed)
            self._keep(self._tasks, task, kept, now + ttl_s)
            if task != request:
                self._keep(self._requests, request, task, now + ttl_s)
            return replace(before, superseded=True)
        failed = before.failed
        state = TaskState(route, ok and not failed, failed, owner, started_ms=settled.started_ms)
        self._keep(self._tasks, task, state, now + ttl_s)
        if task != request:
            self._keep(self._requests, request, task, now + ttl_s)
        return before

    async def task_feedback(
        self, key: str, ok: bool, caller: str | None, ttl_s: float, early: EarlyBound
    ) -> Feedback:
        now = time.monotonic()
        task = self._live(self._requests, key, now) or key
        before = self._live(self._tasks, task, now)
        if before is None:
            if ok or caller is None:
                return Feedback(task, TaskState(), FeedbackResult.IGNORED)
            return Feedback(task, TaskState(), self._keep_early(task, caller, now, early))
        if caller is not None and caller != before.owner:
            return Feedback(task, before, FeedbackResult.NOT_OWNER)
        if not ok:
            self._keep(self._tasks, task, replace(before, ok=False, failed=True), now + ttl_s)
        return Feedback(task, before, FeedbackResult.APPLIED)

    def _keep_early(self, name: str, caller: str, now: float, early: EarlyBound) -> FeedbackResult:
        while self._early and next(iter(self._early.values()))[1] < now:
            self._early_by[self._early.popitem(last=False)[1][0]] -= 1
        held = self._early.get(name)
        if held is not None and held[0] == caller:
            return FeedbackResult.KEPT
        if self._early_by[caller] >= early.max_per_caller:
            return FeedbackResult.TOO_EARLY
        if held is not None:
            self._early_by[held[0]] -= 1
        self._early[name] = (caller, now + early.keep_s)
        self._early.move_to_end(name)
        self._early_by[caller] += 1
        return FeedbackResult.KEPT

    def _take_early(self, name: str, owner: str, now: float) -> bool:
        """Whether `owner`'s early failure feedback on `name` was waiting (it is used up)."""
        held = self._early.pop(name, None)
        if held is None:
            return False
        self._early_by[held[0]] -= 1
        return held[0] == owner and held[1] >= now

    def _live(self, entries: OrderedDict[str, tuple[V, float]], key: str, now: float) -> V | None:
        entry = entries.get(key)
        if entry is None or entry[1] < now:
            return None
        return entry[0]

    def _keep(self, entries: OrderedDict[str, tuple[V, float]], key: str, value: V, expires: float) -> None:
        entries[key] = (value, expires)
        entries.move_to_end(key)
        while len(entries) > self._max_tasks:
            entries.popitem(last=False)
