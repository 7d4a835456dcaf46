"""Tasks and feedback in Redis (router/state/roles.py, `Tasks`): one hash per task
(`...:task:{name}`: route, ok, failed, owner), kept `tasks.ttl_s`; a request of a named task
points at it (`moved`), so feedback by request id finds its task. Early failure feedback is
an `early` mark on the hash it names, kept `tasks.early_feedback_s` and counted per caller
and window (`...:early:{caller}:N`), so a caller can keep at most twice its bound across a
window's edge. Every script touches one task's keys (one hash slot)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from redis.exceptions import RedisError

from router.errors import StoreUnavailable
from router.state.redis.link import RedisRole
from router.state.redis.scripts import EARLY_MARK, LINK_REQUEST, SETTLE_TASK, TASK_FEEDBACK
from router.state.tasks import EarlyBound, Feedback, FeedbackResult, Settlement, TaskState


class RedisTasks(RedisRole):
    REQUEST_PATH = True  # a request's settlement travels with the next acquire

    def task_key(self, name: str) -> str:
        return self._keys.task(name)

    async def settle_task(self, settled: Settlement, ttl_s: float) -> TaskState:
        ttl_ms = int(ttl_s * 1000)
        marked = False
        if settled.task != settled.request:  # the request points at its task, for feedback
            args = [settled.task, ttl_ms, settled.owner]
            key = self.task_key(settled.request)
            marked = int(await self._batch.call_script(LINK_REQUEST, [key], args, lazy=True)) == 1
        ok, failed = "1" if settled.ok else "0", "1" if marked else "0"
        args = [settled.route, ok, ttl_ms, settled.owner, failed, settled.started_ms]
        key = self.task_key(settled.task)
        before = await self._batch.call_script(SETTLE_TASK, [key], args, lazy=True)
        return _task_state(before)

    async def task_feedback(
        self, key: str, ok: bool, caller: str | None, ttl_s: float, early: EarlyBound
    ) -> Feedback:
        try:
            return await self._feedback(key, ok, caller, int(ttl_s * 1000), early)
        except RedisError as exc:
            raise StoreUnavailable(f"the feedback could not be stored: Redis is unreachable ({exc})") from exc

    async def _feedback(
        self, task: str, ok: bool, caller: str | None, ttl_ms: int, early: EarlyBound
    ) -> Feedback:
        """Follow a request to its task, apply, or keep an early failure (bounded per caller:
        a counter per `early.keep_s` window, so at most twice the bound across a boundary)."""
        for _ in range(4):  # a request moves once; a task settled meanwhile is applied next turn
            args = ["1" if ok else "0", ttl_ms, caller or ""]
            kind, *rest = await self._batch.call_script(TASK_FEEDBACK, [self.task_key(task)], args)
            kind = _text(kind)
            if kind == "moved":
                task = _text(rest[-1])
                continue
            if kind != "unsettled":
                result = FeedbackResult.APPLIED if kind == "applied" else FeedbackResult.NOT_OWNER
                return Feedback(task, _task_state(rest), result)
            if ok or caller is None:
                return Feedback(task, TaskState(), FeedbackResult.IGNORED)
            if not await self._early_allowed(caller, early):
                return Feedback(task, TaskState(), FeedbackResult.TOO_EARLY)
            keep_ms = int(early.keep_s * 1000)
            mark, target = await self._batch.call_script(EARLY_MARK, [self.task_key(task)], [caller, keep_ms])
            if _text(mark) == "kept":
                return Feedback(task, TaskState(), FeedbackResult.KEPT)
            task = _text(target) or task
        raise StoreUnavailable(f"the feedback on {task} kept racing its settlement; try again")

    async def _early_allowed(self, caller: str, early: EarlyBound) -> bool:
        window = int(time.time() // early.keep_s)
        key = self._keys.early(caller, window)
        kept = await self._batch.call("INCR", key)
        if int(kept) == 1:
            await self._batch.call("PEXPIRE", key, int(early.keep_s * 2000), lazy=True)
        return int(kept) <= early.max_per_caller


def _task_state(reply: Sequence[Any]) -> TaskState:
    """A settle's reply (route, ok, failed, owner, superseded, started) or a feedback's (the first four)."""
    route, ok, failed, owner, *settle = reply
    state = TaskState(_text(route), bool(int(ok)), bool(int(failed)), _text(owner))
    if settle:
        superseded, started = settle
        state = replace(state, superseded=bool(int(superseded)), started_ms=int(started))
    return state


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
