"""Did a served answer succeed? The automatic layers of the economics' success definition.

1. transport: 2xx and complete (a stream that ended with `[DONE]`), decided by the caller;
2. checks that need no application knowledge: every choice's `finish_reason` is accepted
   (`models.*.success.finish_reasons`, and `length` under the caller's own max_tokens unless
   `success.length_under_max_tokens: failure`), tool-call arguments parse as JSON, and an answer
   asked for as `response_format` json_object/json_schema parses (and matches the schema).

Every check runs in time linear in the answer (router/record/linear.py): answers are read up to
`success.max_checked_bytes`, a schema over 64 KiB is not checked (router/openai.py), and no
`pattern` backtracks. Application feedback (`POST /v1/feedback`) is the third layer, applied to the task later
(router/record/tasks.py). The checks run after the answer was sent, never on its critical path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from router.config import SuccessConfig
from router.openai import RequestPeek
from router.record import linear


@dataclass(slots=True)
class AnswerShape:
    """What the checks read of an answer, from a body or gathered from a stream's events."""

    finish_reasons: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)  # choice 0's content, in pieces
    tool_args: dict[tuple[int, int], list[str]] = field(default_factory=dict)  # (choice, call) -> pieces
    tool_names: dict[tuple[int, int], str] = field(default_factory=dict)  # (choice, call) -> function name
    kept_bytes: int = 0
    truncated: bool = False  # more text than `max_checked_bytes`: JSON checks skipped

    def add_text(self, piece: str, limit: int) -> None:
        self._keep(self.text, piece, limit)

    def add_tool_args(self, key: tuple[int, int], piece: str, limit: int) -> None:
        self._keep(self.tool_args.setdefault(key, []), piece, limit)

    def _keep(self, pieces: list[str], piece: str, limit: int) -> None:
        if self.truncated:
            return
        self.kept_bytes += len(piece)
        if self.kept_bytes > limit:
            self.truncated = True
            return
        pieces.append(piece)

    def take_choices(self, choices: Any, limit: int, *, collect: bool) -> None:
        """Read OpenAI `choices` (a body's messages or a stream chunk's deltas)."""
        if not isinstance(choices, list):
            return
        for position, choice in enumerate(choices):
            if not isinstance(choice, dict):
                continue
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                self.finish_reasons.append(reason)
            if not collect:
                continue
            index = choice.get("index", position)
            message = choice.get("delta") or choice.get("message") or {}
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if index == 0 and isinstance(content, str):
                self.add_text(content, limit)
            for n, call in enumerate(message.get("tool_calls") or ()):
                if not isinstance(call, dict):
                    continue
                function = call.get("function")
                name = function.get("name") if isinstance(function, dict) else None
                if isinstance(name, str) and name:  # a stream names the function in its first delta
                    self.tool_names[(index, call.get("index", n))] = name
                arguments = function.get("arguments") if isinstance(function, dict) else None
                if isinstance(arguments, str):
                    self.add_tool_args((index, call.get("index", n)), arguments, limit)


def judge(shape: AnswerShape, config: SuccessConfig, request: RequestPeek) -> str | None:
    """None when the answer passes every automatic check; else the first failed check's name."""
    for reason in shape.finish_reasons:
        if reason not in config.finish_reasons and not _asked_for(reason, config, request):
            return f"finish_{reason}"[:40]
    if not config.check_json or shape.truncated:
        return None
    for pieces in shape.tool_args.values():
        if _loads("".join(pieces)) is _INVALID:
            return "tool_args_invalid"
    wanted = request.answer_format
    if wanted is not None and shape.text:
        answer = _loads("".join(shape.text))
        if answer is _INVALID:
            return "json_invalid"
        if wanted.schema is not None and not linear.matches(answer, wanted.schema):
            return "json_schema_mismatch"
    return None


def cut_by_caller(shape: AnswerShape, request: RequestPeek) -> bool:
    """The answer ended `length` under the client's own token limit: however it is judged, its
    length (and so its latency per token) was the caller's choice, not the route's."""
    return request.caps_output and "length" in shape.finish_reasons


def _asked_for(reason: str, config: SuccessConfig, request: RequestPeek) -> bool:
    """A `length` end under the caller's own output limit is the answer the caller asked for
    (`success.length_under_max_tokens`); without one, the engine's context cut it short."""
    return reason == "length" and request.caps_output and config.length_under_max_tokens == "success"


_INVALID = object()


def _loads(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return _INVALID
