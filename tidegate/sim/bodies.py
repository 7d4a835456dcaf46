"""OpenAI-shaped response bodies and stream events the simulator sends, for the choices
tidegate/sim/answers.py planned. Shapes follow the OpenAI API spec (tests validate them
against its schemas, tests/data/openai_schemas.json)."""

from __future__ import annotations

import base64
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson

from tidegate.sim.answers import Choice, ToolCall


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(kind: str, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    if kind == "responses":
        return {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        }
    return {
        "prompt_tokens": input_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }


def _logprob_entry(token: str, top: int) -> dict[str, Any]:
    alternatives = [
        {"token": token, "logprob": -0.01, "bytes": list(token.encode())},
        *({"token": f"alt{k}", "logprob": -2.0 - k, "bytes": list(f"alt{k}".encode())} for k in range(top)),
    ][:top]
    return {"token": token, "logprob": -0.01, "bytes": list(token.encode()), "top_logprobs": alternatives}


def _chat_logprobs(pieces: tuple[str, ...], top: int) -> dict[str, Any]:
    return {"content": [_logprob_entry(p, top) for p in pieces], "refusal": None}


def _text_logprobs(pieces: tuple[str, ...], top: int, offset: int = 0) -> dict[str, Any]:
    offsets, at = [], offset
    for piece in pieces:
        offsets.append(at)
        at += len(piece)
    return {
        "tokens": list(pieces),
        "token_logprobs": [-0.01] * len(pieces),
        "top_logprobs": [{p: -0.01} for p in pieces] if top else None,
        "text_offset": offsets,
    }


def _tool_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def completion(
    kind: str, model: str, choices: tuple[Choice, ...], use: dict[str, Any], logprobs: int | None
) -> bytes:
    """A whole non-stream answer. `logprobs`: None, or how many alternatives per token."""
    created = int(time.time())
    if kind == "chat":
        body: dict[str, Any] = {
            "id": new_id("chatcmpl"),
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [_chat_choice(i, c, logprobs) for i, c in enumerate(choices)],
            "usage": use,
        }
    elif kind == "text":
        body = {
            "id": new_id("cmpl"),
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": i,
                    "text": c.text,
                    "finish_reason": c.finish_reason,
                    "logprobs": _text_logprobs(c.pieces, logprobs) if logprobs is not None else None,
                }
                for i, c in enumerate(choices)
            ],
            "usage": use,
        }
    else:
        body = response_object(model, choices[0], use, "completed")
    return orjson.dumps(body)


def _chat_choice(index: int, choice: Choice, logprobs: int | None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if choice.tool_calls else choice.text,
        "refusal": None,
    }
    if choice.tool_calls:
        message["tool_calls"] = [_tool_call(c) for c in choice.tool_calls]
    return {
        "index": index,
        "finish_reason": choice.finish_reason,
        "logprobs": _chat_logprobs(choice.pieces, logprobs) if logprobs is not None else None,
        "message": message,
    }


def embeddings(model: str, count: int, input_tokens: int, dimensions: int, encoding: str) -> bytes:
    data = []
    for i in range(count):
        vector = [0.1 * ((i + j) % 7) for j in range(dimensions)]
        value: Any = vector
        if encoding == "base64":  # little-endian float32, as the SDKs decode it
            value = base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": value})
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": input_tokens, "total_tokens": input_tokens},
        }
    )


class StreamWriter:
    """SSE events of one stream, in the framing of the API that was called: `opening()`,
    then `step(i)` for each token step (every choice that still has a token at step i),
    then `closing(use)`."""

    def __init__(
        self, kind: str, model: str, choices: tuple[Choice, ...], include_usage: bool, logprobs: int | None
    ) -> None:
        self.kind = kind
        self.model = model
        self.choices = choices
        self.include_usage = include_usage
        self.logprobs = logprobs
        self.id = new_id("chatcmpl" if kind == "chat" else "cmpl" if kind == "text" else "resp")
        self.created = int(time.time())
        self._seq = 0
        self._item = "msg_" + self.id

    @property
    def steps(self) -> int:
        """Token steps: the longest choice's tokens (a tool call's arguments go in one step)."""
        return max(len(c.pieces) if not c.tool_calls else 1 for c in self.choices)

    def opening(self) -> bytes:
        if self.kind == "chat":
            return b"".join(
                self._chunk(
                    [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
                )
                for i, c in enumerate(self.choices)
                if not c.tool_calls
            )
        if self.kind == "responses":
            return b"".join(self._response_opening())
        return b""

    def step(self, i: int) -> bytes:
        out = []
        for index, choice in enumerate(self.choices):
            if choice.tool_calls:
                if i == 0:
                    out.append(self._tool_call_chunks(index, choice))
                continue
            if i < len(choice.pieces):
                out.append(self._token(index, choice.pieces[i]))
        return b"".join(out)

    def closing(self, use: dict[str, Any]) -> bytes:
        if self.kind == "responses":
            return b"".join(self._response_closing(use))
        out = []
        for index, choice in enumerate(self.choices):
            done: dict[str, Any] = {"index": index, "finish_reason": choice.finish_reason}
            if self.kind == "chat":
                done.update(delta={}, logprobs=None)
            else:
                done.update(text="", logprobs=None)
            out.append(self._chunk([done]))
        if self.include_usage:
            out.append(self._chunk([], use))
        return b"".join(out) + b"data: [DONE]\n\n"

    def _token(self, index: int, piece: str) -> bytes:
        if self.kind == "chat":
            logprobs = _chat_logprobs((piece,), self.logprobs) if self.logprobs is not None else None
            choice = {
                "index": index,
                "delta": {"content": piece},
                "logprobs": logprobs,
                "finish_reason": None,
            }
            return self._chunk([choice])
        if self.kind == "text":
            logprobs = _text_logprobs((piece,), self.logprobs) if self.logprobs is not None else None
            return self._chunk([{"index": index, "text": piece, "finish_reason": None, "logprobs": logprobs}])
        return self._event(
            "response.output_text.delta",
            {"item_id": self._item, "output_index": 0, "content_index": 0, "delta": piece, "logprobs": []},
        )

    def _tool_call_chunks(self, index: int, choice: Choice) -> bytes:
        """The shape the SDKs assemble: the call's id and name first, then its arguments."""
        if self.kind == "responses":
            return b"".join(self._response_function_call(choice.tool_calls[0]))
        out = []
        for k, call in enumerate(choice.tool_calls):
            head = {
                "index": k,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            delta: dict[str, Any] = {"tool_calls": [head]}
            if k == 0:
                delta = {"role": "assistant", "content": None, **delta}
            out.append(
                self._chunk([{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}])
            )
            args = {"tool_calls": [{"index": k, "function": {"arguments": call.arguments}}]}
            out.append(
                self._chunk([{"index": index, "delta": args, "logprobs": None, "finish_reason": None}])
            )
        return b"".join(out)

    def _chunk(self, choices: list[dict[str, Any]], use: dict[str, Any] | None = None) -> bytes:
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

    # --- the Responses API's event sequence -------------------------------------------------

    def _event(self, name: str, data: dict[str, Any]) -> bytes:
        body = {"type": name, "sequence_number": self._seq, **data}
        self._seq += 1
        return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n"

    def _response_opening(self) -> Iterator[bytes]:
        started = response_object(self.model, None, None, "in_progress", self.id)
        yield self._event("response.created", {"response": started})
        yield self._event("response.in_progress", {"response": started})
        if self.choices[0].tool_calls:
            return
        item = {
            "type": "message",
            "id": self._item,
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        yield self._event("response.output_item.added", {"output_index": 0, "item": item})
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        yield self._event(
            "response.content_part.added",
            {"item_id": self._item, "output_index": 0, "content_index": 0, "part": part},
        )

    def _response_function_call(self, call: ToolCall) -> Iterator[bytes]:
        item = _function_call_item(call, "in_progress", arguments="")
        yield self._event("response.output_item.added", {"output_index": 0, "item": item})
        yield self._event(
            "response.function_call_arguments.delta",
            {"item_id": item["id"], "output_index": 0, "delta": call.arguments},
        )
        yield self._event(
            "response.function_call_arguments.done",
            {"item_id": item["id"], "output_index": 0, "name": call.name, "arguments": call.arguments},
        )
        yield self._event(
            "response.output_item.done", {"output_index": 0, "item": _function_call_item(call, "completed")}
        )

    def _response_closing(self, use: dict[str, Any]) -> Iterator[bytes]:
        choice = self.choices[0]
        if not choice.tool_calls:
            text = choice.text
            where = {"item_id": self._item, "output_index": 0, "content_index": 0}
            yield self._event("response.output_text.done", {**where, "text": text, "logprobs": []})
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            yield self._event("response.content_part.done", {**where, "part": part})
            item = _message_item(self._item, text, ended(choice))
            yield self._event("response.output_item.done", {"output_index": 0, "item": item})
        done = response_object(self.model, choice, use, "completed", self.id)
        yield self._event(f"response.{done['status']}", {"response": done})


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _function_call_item(call: ToolCall, status: str, arguments: str | None = None) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_" + call.id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if arguments is None else arguments,
        "status": status,
    }


def ended(choice: Choice) -> str:
    """How a Responses answer ended: cut by max_output_tokens is `incomplete`."""
    return "incomplete" if choice.finish_reason == "length" and not choice.tool_calls else "completed"


def response_object(
    model: str, choice: Choice | None, use: dict[str, Any] | None, status: str, rid: str | None = None
) -> dict[str, Any]:
    """`status` "completed" of an answer cut at max_output_tokens is "incomplete", as OpenAI's."""
    rid = rid or new_id("resp")
    output: list[dict[str, Any]] = []
    if status == "completed" and choice is not None:
        status = ended(choice)
    if choice is not None and choice.tool_calls:
        output = [_function_call_item(c, "completed") for c in choice.tool_calls]
    elif choice is not None:
        output = [_message_item("msg_" + rid, choice.text, status)]
    cut = {"reason": "max_output_tokens"} if status == "incomplete" else None
    body: dict[str, Any] = {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": cut,
        "instructions": None,
        "metadata": {},
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "tool_choice": "auto",
        "tools": [],
    }
    if use is not None:  # the spec has no null usage: a response in progress has none yet
        body["usage"] = use
    return body
