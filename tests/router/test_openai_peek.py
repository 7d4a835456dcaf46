"""Peeking at request bodies and rewriting them for an upstream."""

from __future__ import annotations

import orjson
import pytest

from router.errors import InvalidRequest
from router.openai import peek, upstream_body


@pytest.mark.parametrize(
    ("body", "model", "stream", "user", "wants_usage"),
    [
        (b'{"model": "m"}', "m", False, None, False),
        (b'{"model": "m", "stream": true, "user": "u1"}', "m", True, "u1", False),
        (b'{"model": "m", "stream": null}', "m", False, None, False),
        (b'{"model": "m", "stream": true, "stream_options": {"include_usage": true}}', "m", True, None, True),
    ],
)
def test_peek_reads_what_routing_needs(body, model, stream, user, wants_usage):
    seen = peek(body)
    assert (seen.model, seen.stream, seen.user, seen.wants_usage) == (model, stream, user, wants_usage)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"", None),
        (b"\xff\xfe", None),
        (b"null", None),
        (b'"m"', None),
        (b"{}", "model"),
        (b'{"model": ""}', "model"),
        (b'{"model": ["m"]}', "model"),
        (b'{"model": "m", "stream": 1}', "stream"),
        (b'{"model": "m", "user": 7}', "user"),
        (b'{"model": "m", "stream_options": true}', "stream_options"),
        (b'{"model": "m", "max_tokens": 0}', "max_tokens"),
        (b'{"model": "m", "max_tokens": -5}', "max_tokens"),
        (b'{"model": "m", "max_tokens": 1e9}', "max_tokens"),
        (b'{"model": "m", "max_tokens": true}', "max_tokens"),
        (b'{"model": "m", "max_completion_tokens": 99999999999}', "max_completion_tokens"),
        (b'{"model": "m", "max_output_tokens": "10"}', "max_output_tokens"),
    ],
)
def test_peek_rejects_what_routing_cannot_use(body, param):
    with pytest.raises(InvalidRequest) as caught:
        peek(body)
    assert caught.value.param == param
    assert caught.value.status_code == 400


def test_upstream_body_rewrites_the_model_and_asks_for_stream_usage():
    request = peek(b'{"model": "m", "stream": true, "stream_options": {"x": 1}, "messages": []}')
    sent = orjson.loads(upstream_body(request, "org/model-7b", ask_usage=True))
    assert sent == {
        "model": "org/model-7b",
        "stream": True,
        "stream_options": {"x": 1, "include_usage": True},
        "messages": [],
    }
    assert request.payload["model"] == "m"  # the client's parsed body is not mutated


def test_upstream_body_leaves_non_streams_and_embeddings_alone():
    request = peek(b'{"model": "m", "input": "x"}')
    assert orjson.loads(upstream_body(request, "e", ask_usage=False)) == {"model": "e", "input": "x"}
    request = peek(b'{"model": "m", "messages": []}')
    assert "stream_options" not in orjson.loads(upstream_body(request, "e", ask_usage=True))
