"""The official openai-python SDK's helpers through the gateway, in front of the simulator,
over real HTTP: structured outputs with a pydantic model, the chat stream helper, tool calls
and a tool-result round, the Responses stream helper, models.retrieve and embeddings with the
SDK's own encoding. (This SDK version has no tool-runner helper; the Node script below drives
openai-node's runTools.)"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pydantic
import pytest

from router.app import create_app
from tests.conftest import gateway_config, serverless_profile
from tests.servers import Sim, ThreadServer


class Answer(pydantic.BaseModel):
    title: str
    score: int
    tags: list[str]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def sdk() -> Iterator[openai.OpenAI]:
    with Sim(serverless_profile()) as sl, ThreadServer(create_app(gateway_config(None, [sl]))) as gw:
        yield openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=30)


def test_structured_output_parses_into_the_pydantic_model(sdk):
    completion = sdk.chat.completions.parse(model="m", messages=ASK, response_format=Answer)
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Answer) and parsed.tags
    assert completion.choices[0].finish_reason == "stop"


def test_the_chat_stream_helper_assembles_the_answer(sdk):
    with sdk.chat.completions.stream(model="m", messages=ASK) as stream:  # (it refuses a "length" end)
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(deltas) == final.choices[0].message.content
    assert final.choices[0].finish_reason == "stop" and final.model == "m"


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_round_trip(sdk, stream):
    if stream:
        with sdk.chat.completions.stream(
            model="m", messages=ASK, tools=[WEATHER], tool_choice="required"
        ) as s:
            message = s.get_final_completion().choices[0].message
    else:
        message = (
            sdk.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="required")
            .choices[0]
            .message
        )
    (call,) = message.tool_calls
    assert call.function.name == "get_weather" and isinstance(
        json.loads(call.function.arguments)["city"], str
    )
    answered = [
        *ASK,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    after = sdk.chat.completions.create(model="m", messages=answered, tools=[WEATHER])
    assert after.choices[0].message.content and not after.choices[0].message.tool_calls


def test_the_responses_stream_helper_gets_every_event_in_order(sdk):
    with sdk.responses.stream(model="m", input="hi") as stream:  # no limit: the answer stops
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final.output_text and final.status == "completed"


def test_a_response_cut_by_max_output_tokens_is_incomplete(sdk):
    cut = sdk.responses.create(model="m", input="hi", max_output_tokens=3)
    assert cut.status == "incomplete" and cut.output_text
    assert cut.incomplete_details is not None and cut.incomplete_details.reason == "max_output_tokens"
    events = [e.type for e in sdk.responses.create(model="m", input="hi", max_output_tokens=3, stream=True)]
    assert events[-1] == "response.incomplete"


def test_models_retrieve_and_list(sdk):
    assert sdk.models.retrieve("m").id == "m"
    assert [m.id for m in sdk.models.list()] == ["m"]
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("nope")


@pytest.mark.parametrize("encoding", [None, "float", "base64"])
def test_embeddings_in_the_sdks_encodings(sdk, encoding):
    extra = {} if encoding is None else {"encoding_format": encoding}
    reply = sdk.embeddings.create(model="m", input=["a", "b"], dimensions=12, **extra)
    vectors = [d.embedding for d in reply.data]
    assert len(vectors) == 2
    if encoding != "base64":  # the SDK decodes its own default; an explicit base64 stays a string
        assert all(len(v) == 12 and all(isinstance(x, float) for x in v) for v in vectors)
