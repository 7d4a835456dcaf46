"""`POST /v1/feedback`: the application says whether a request, or a task, succeeded.

    {"request_id": "req_...", "success": false, "reason": "answer failed our validator"}
    {"task_id": "checkout-42", "success": false}

`request_id` is a response's `x-tidegate-request-id`; `task_id` the `x-tidegate-task-id` the
client sent. A failure marks the task failed: it no longer counts as a successful task on its
route (router/record/tasks.py). Only the key that made the request or task may judge it (another
key gets 403); the admin key may judge any request, and a key's task when `key_id` names the
key (as the access log shows it). Feedback that arrives before the request was settled (the
answer is settled in the background, right after it was sent) is kept, within a bound per
key, and applied when it is: the answer says `"applied": false` then.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from router.errors import ClientError, InvalidRequest, RateLimited
from router.http.auth import ApiKeys, KeyDigests, bearer_token
from router.http.bodies import read_body
from router.openai import json_object
from router.record.tasks import TaskLedger, task_name, valid_task_id
from router.state.tasks import FeedbackResult

log = logging.getLogger("tidegate")

MAX_FEEDBACK_BYTES = 16 * 1024
MAX_REASON_CHARS = 256
_REQUEST_ID = re.compile(r"req_[0-9a-f]{24}")
_KEY_ID = re.compile(r"key-[0-9a-f]{12}|anonymous|[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # named keys too
_FIELDS = frozenset({"request_id", "task_id", "success", "reason", "key_id"})


class NotYours(ClientError):
    status = 403
    code = "permission_denied"


@dataclass(frozen=True, slots=True)
class _Said:
    key: str  # what the store is asked about: a request id or a task's name
    shown: str  # its name for the log and the answer
    task_id: str | None
    request_id: str | None
    success: bool
    reason: str | None


def feedback_route(ledger: TaskLedger, keys: ApiKeys, admin: KeyDigests, body_timeout_s: float) -> Route:
    async def feedback(request: Request) -> Response:
        token = bearer_token(request)
        caller = None if token is not None and admin.accepts(token) else keys.check(request).name
        body = await read_body(request, MAX_FEEDBACK_BYTES, body_timeout_s)
        said = _parse(body, caller)
        found = await ledger.feedback(said.key, said.success, caller)
        if found.result is FeedbackResult.NOT_OWNER:
            raise NotYours(f"{said.shown} was made with another API key; only that key can judge it")
        if found.result is FeedbackResult.TOO_EARLY:
            raise RateLimited(
                "too much failure feedback on requests or tasks the gateway has not settled yet "
                "(tasks.max_early_feedback per tasks.early_feedback_s); try again shortly"
            )
        if not said.success:  # client text reaches the log only JSON-encoded: no forged lines
            log.info("feedback: %s", orjson.dumps({"failed": said.shown, "reason": said.reason}).decode())
        answer: dict[str, Any] = {
            "object": "feedback",
            "task_id": said.task_id,
            "request_id": said.request_id,
            "success": said.success,
            "applied": found.result is FeedbackResult.APPLIED,
        }
        return Response(orjson.dumps(answer), media_type="application/json")

    return Route("/v1/feedback", feedback, methods=["POST"])


def _parse(body: bytes, caller: str | None) -> _Said:
    """What the feedback says, checked; InvalidRequest otherwise."""
    payload = json_object(body, "feedback body")
    unknown = set(payload) - _FIELDS
    if unknown:
        raise InvalidRequest(f"unknown feedback field: {sorted(unknown)[0]}", param=sorted(unknown)[0])
    success = payload.get("success")
    if not isinstance(success, bool):
        raise InvalidRequest("'success' must be true or false", param="success")
    reason = payload.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS):
        raise InvalidRequest(
            f"'reason' must be a string of at most {MAX_REASON_CHARS} characters", param="reason"
        )
    request_id, task_id = payload.get("request_id"), payload.get("task_id")
    if (request_id is None) == (task_id is None):
        raise InvalidRequest("give exactly one of 'request_id' or 'task_id'", param="request_id")
    if request_id is not None:
        if not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id):
            raise InvalidRequest(
                "'request_id' must be a response's x-tidegate-request-id (req_ and 24 hex digits)",
                param="request_id",
            )
        return _Said(request_id, request_id, None, request_id, success, reason)
    if not isinstance(task_id, str) or not valid_task_id(task_id):
        raise InvalidRequest(
            "'task_id' must be 1 to 128 characters of A-Z, a-z, 0-9, '.', '_', ':' or '-'", param="task_id"
        )
    owner = _owner(payload.get("key_id"), caller)
    return _Said(task_name(owner, "t:" + task_id, ""), f"task {task_id}", task_id, None, success, reason)


def _owner(key_id: Any, caller: str | None) -> str:
    """Whose task a task id names: the caller's own; the admin names the key."""
    if caller is not None:
        if key_id is not None:
            raise InvalidRequest("'key_id' is for the admin key only", param="key_id")
        return caller
    if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
        raise InvalidRequest(
            "with the admin key, 'key_id' names whose task it is (key-<12 hex digits>, as logged)",
            param="key_id",
        )
    return key_id
