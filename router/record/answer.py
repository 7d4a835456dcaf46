"""What a parity check reads of an answer: its text, tool calls, finish reason, refusal and
output tokens, from a chat completion or a Responses API body alike."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from router.record.success import AnswerShape

# How models word a refusal when they do not use the API's `refusal` field
REFUSAL_PATTERN = re.compile(
    r"^\W*(I'?m sorry|I am sorry|I apologi[sz]e|I can(?:no|')t (?:help|assist|comply|do that)|"
    r"I'?m (?:not able|unable) to|I won'?t be able to|As an AI)",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class ToolUse:
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass(frozen=True, slots=True)
class Answer:
    text: str
    finish_reason: str | None
    tool_calls: tuple[ToolUse, ...] = ()
    refusal: str | None = None  # the API's refusal field, or the text when it reads as one
    output_tokens: int | None = None

    @property
    def refused(self) -> bool:
        return self.refusal is not None

    def json_document(self) -> Any:
        """The text as JSON (a ```json fence stripped); raises ValueError when it is not."""
        text = self.text.strip()
        if text.startswith("```"):
            text = text.split("\n", 1)[1] if "\n" in text else ""
            text = text.rsplit("```", 1)[0]
        return orjson.loads(text)


def read_answer(api: str, body: Any) -> Answer:
    """An answer from a response body; ValueError when the body is not one."""
    if not isinstance(body, dict):
        raise ValueError("the answer is not a JSON object")
    return _chat(body) if api == "chat" else _responses(body)


def _chat(body: dict[str, Any]) -> Answer:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("the answer has no choices")
    choice = choices[0]
    found = choice.get("message")
    message: dict[str, Any] = found if isinstance(found, dict) else {}
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    calls = tuple(
        ToolUse(str(fn.get("name", "")), str(fn.get("arguments", "")))
        for fn in (c.get("function") for c in message.get("tool_calls") or () if isinstance(c, dict))
        if isinstance(fn, dict)
    )
    refusal = message.get("refusal") if isinstance(message.get("refusal"), str) else None
    finish = choice.get("finish_reason")
    return Answer(
        text,
        finish if isinstance(finish, str) else None,
        calls,
        refusal or _worded_refusal(text),
        _tokens(body, "completion_tokens"),
    )


def _responses(body: dict[str, Any]) -> Answer:
    texts: list[str] = []
    calls: list[ToolUse] = []
    refusal = None
    for item in body.get("output") or ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            calls.append(ToolUse(str(item.get("name", "")), str(item.get("arguments", ""))))
        parts = item.get("content") if item.get("type") == "message" else None
        for part in parts if isinstance(parts, list) else ():
            if isinstance(part, dict) and part.get("type") == "output_text":
                texts.append(str(part.get("text", "")))
            elif isinstance(part, dict) and part.get("type") == "refusal":
                refusal = str(part.get("refusal", ""))
    text = "".join(texts)
    status = body.get("status")
    finish: str | None = "tool_calls" if calls else "length" if status == "incomplete" else "stop"
    if status not in ("completed", "incomplete"):
        finish = str(status) if status is not None else None  # failed, cancelled, ...
    refused = refusal or _worded_refusal(text)
    return Answer(text, finish, tuple(calls), refused, _tokens(body, "output_tokens"))


def _worded_refusal(text: str) -> str | None:
    return text if REFUSAL_PATTERN.match(text) else None


def _tokens(body: dict[str, Any], key: str) -> int | None:
    usage = body.get("usage")
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def from_shape(shape: AnswerShape) -> Answer:
    """What the gateway gathered of a live answer (choice 0's text and tool calls, up to
    `success.max_checked_bytes`) as an Answer, to compare a shadow's answer with."""
    text = "".join(shape.text)
    calls = tuple(
        ToolUse(shape.tool_names.get(key, ""), "".join(shape.tool_args.get(key, ())))
        for key in sorted(set(shape.tool_names) | set(shape.tool_args))
        if key[0] == 0
    )
    finish = shape.finish_reasons[0] if shape.finish_reasons else None
    return Answer(text, finish, calls, _worded_refusal(text))
