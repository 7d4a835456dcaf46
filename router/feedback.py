"""`POST /v1/feedback`: the application says whether a request, or a task, succeeded.

    {"request_id": "req_...", "success": false, "reason": "answer failed our validator"}
    {"task_id": "checkout-42", "success": false}

`request_id` is a response's `x-tidegate-request-id`; `task_id` the `x-tidegate-task-id` the
client sent. A failure marks the task failed: it no longer counts as a successful task on its
route (router/tasks.py). Feedback that arrives before the request was settled (the answer is
settled in the background, right after it was sent) is kept and applied when it is: the
answer says `"applied": false` then.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from router.api import read_body
from router.auth import ApiKeys
from router.errors import InvalidRequest
from router.openai import json_object
from router.tasks import TaskLedger

log = logging.getLogger("tidegate")

MAX_FEEDBACK_BYTES = 16 * 1024
MAX_REASON_CHARS = 256
_REQUEST_ID = re.compile(r"^req_[0-9a-f]{24}$")
_TASK_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def feedback_route(ledger: TaskLedger, keys: ApiKeys, body_timeout_s: float) -> Route:
    async def feedback(request: Request) -> Response:
        keys.check(request)
        body = await read_body(request, MAX_FEEDBACK_BYTES, body_timeout_s)
        key, shown, success, reason = _parse(body)
        task, applied = await ledger.feedback(key, success)
        if not success:
            log.info("feedback: %s failed (%s)", shown, reason or "no reason given")
        answer: dict[str, Any] = {
            "object": "feedback",
            "task_id": task.removeprefix("t:") if task.startswith("t:") else None,
            "request_id": key if key.startswith("req_") else None,
            "success": success,
            "applied": applied,
        }
        return Response(orjson.dumps(answer), media_type="application/json")

    return Route("/v1/feedback", feedback, methods=["POST"])


def _parse(body: bytes) -> tuple[str, str, bool, str | None]:
    """(the store key, its name for the log, success, reason); InvalidRequest otherwise."""
    payload = json_object(body, "feedback body")
    unknown = set(payload) - {"request_id", "task_id", "success", "reason"}
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
        if not isinstance(request_id, str) or not _REQUEST_ID.match(request_id):
            raise InvalidRequest(
                "'request_id' must be a response's x-tidegate-request-id (req_ and 24 hex digits)",
                param="request_id",
            )
        return request_id, request_id, success, reason
    if not isinstance(task_id, str) or not _TASK_ID.match(task_id):
        raise InvalidRequest(
            "'task_id' must be 1 to 128 characters of A-Z, a-z, 0-9, '.', '_', ':' or '-'", param="task_id"
        )
    return "t:" + task_id, f"task {task_id}", success, reason
