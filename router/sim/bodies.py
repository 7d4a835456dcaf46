"""OpenAI-shaped response bodies and stream events the simulator sends."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

_WORDS = ("the", "tide", "gate", "routes", "every", "token", "to", "a", "warm", "replica")


def word(i: int) -> str:
    return _WORDS[i % len(_WORDS)] + " "


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(kind: str, input_tokens: int, output_tokens: int) -> dict[str, int]:
    if kind == "responses":
        return {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }
    return {
        "prompt_tokens": input_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }


def completion(kind: str, model: str, text: str, finish: str, use: dict[str, int]) -> bytes:
    created = int(time.time())
    if kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "finish_reason": finish,
            "logprobs": None,
            "message": {"role": "assistant", "content": text},
        }
        return orjson.dumps(
            {
                "id": new_id("chatcmpl"),
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": use,
            }
        )
    if kind == "text":
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        return orjson.dumps(
            {
                "id": new_id("cmpl"),
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": use,
            }
        )
    return orjson.dumps(_response_object(model, text, use, "completed"))


def embeddings(model: str, count: int, input_tokens: int) -> bytes:
    data = [
        {"object": "embedding", "index": i, "embedding": [0.1 * ((i + j) % 7) for j in range(8)]}
        for i in range(count)
    ]
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": input_tokens, "total_tokens": input_tokens},
        }
    )


class StreamWriter:
    """SSE events of one stream, in the framing of the API that was called."""

    def __init__(self, kind: str, model: str, include_usage: bool) -> None:
        self.kind = kind
        self.model = model
        self.include_usage = include_usage
        self.id = new_id("chatcmpl" if kind == "chat" else "cmpl" if kind == "text" else "resp")
        self.created = int(time.time())

    def opening(self) -> bytes:
        if self.kind == "chat":
            return self._chunk(
                [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
            )
        if self.kind == "responses":
            return _event(
                "response.created",
                {
                    "type": "response.created",
                    "sequence_number": 0,
                    "response": _response_object(self.model, "", None, "in_progress", self.id),
                },
            )
        return b""

    def token(self, text: str, seq: int) -> bytes:
        if self.kind == "chat":
            return self._chunk([{"index": 0, "delta": {"content": text}, "finish_reason": None}])
        if self.kind == "text":
            return self._chunk([{"index": 0, "text": text, "finish_reason": None, "logprobs": None}])
        return _event(
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "item_id": "msg_" + self.id,
                "output_index": 0,
                "content_index": 0,
                "delta": text,
                "sequence_number": seq,
            },
        )

    def closing(self, finish: str, text: str, use: dict[str, int]) -> bytes:
        if self.kind == "responses":
            return _event(
                "response.completed",
                {
                    "type": "response.completed",
                    "sequence_number": 1_000_000,
                    "response": _response_object(self.model, text, use, "completed", self.id),
                },
            )
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if self.kind == "chat":
            choice["delta"] = {}
        else:
            choice.update(text="", logprobs=None)
        out = self._chunk([choice])
        if self.include_usage:
            out += self._chunk([], use)
        return out + b"data: [DONE]\n\n"

    def _chunk(self, choices: list[dict[str, Any]], use: dict[str, int] | None = None) -> bytes:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        body: dict[str, Any] = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = use
        return b"data: " + orjson.dumps(body) + b"\n\n"


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _response_object(
    model: str, text: str, use: dict[str, int] | None, status: str, rid: str | None = None
) -> dict[str, Any]:
    output = (
        [
            {
                "type": "message",
                "id": "msg_" + (rid or "0"),
                "status": status,
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ]
        if text
        else []
    )
    return {
        "id": rid or new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "usage": use,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
