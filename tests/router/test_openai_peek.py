"""Peeking at request bodies and rewriting them for an upstream."""

from __future__ import annotations

import tracemalloc

import orjson
import pytest

from router.errors import InvalidRequest
from router.openai import MAX_SCHEMA_BYTES, peek


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
    request = peek(
        b'{"model": "m", "stream": true, "stream_options": {"x": 1}, "messages": []}', ask_usage=True
    )
    sent = orjson.loads(request.body.for_model("org/model-7b"))
    assert sent == {
        "model": "org/model-7b",
        "stream": True,
        "stream_options": {"x": 1, "include_usage": True},
        "messages": [],
    }
    assert orjson.loads(request.body.for_model("other"))["model"] == "other"
    assert orjson.loads(request.body.for_model("org/model-7b")) == sent


def test_upstream_body_leaves_non_streams_and_embeddings_alone():
    request = peek(b'{"model": "m", "input": "x"}', ask_usage=False)
    assert orjson.loads(request.body.for_model("e")) == {"model": "e", "input": "x"}
    request = peek(b'{"model": "m", "messages": []}', ask_usage=True)
    assert "stream_options" not in orjson.loads(request.body.for_model("e"))


def test_the_body_goes_upstream_as_the_client_wrote_it():
    """Every field but `model` is forwarded byte for byte: numbers are not re-encoded, strings
    not re-escaped, the client's order kept."""
    body = rb'{"temperature": 1e5, "model": "m", "messages": [{"content": "caf\u00e9 \"x\""}], "seed": -0}'
    sent = peek(body).body.for_model("up")
    assert sent == rb'{"model":"up","temperature":1e5,"messages":[{"content": "caf\u00e9 \"x\""}],"seed":-0}'


@pytest.mark.parametrize(
    ("body", "wants_checks", "schema"),
    [
        (b'{"model": "m"}', False, None),
        (b'{"model": "m", "tools": []}', False, None),
        (b'{"model": "m", "tools": [ ]}', False, None),
        (b'{"model": "m", "tools": [{"type": "function"}]}', True, None),
        (b'{"model": "m", "response_format": {"type": "text"}}', False, None),
        (b'{"model": "m", "response_format": {"type": "json_object"}}', True, None),
        (
            b'{"model": "m", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}}',
            True,
            b'{"type": "object"}',
        ),
        (b'{"model": "m", "text": {"format": {"type": "json_schema", "schema": {"type": "array"}}}}', True, b'{"type": "array"}'),
        (b'{"model": "m", "response_format": "json"}', False, None),
    ],
)
def test_peek_reads_what_the_success_checks_need(body, wants_checks, schema):
    seen = peek(body)
    assert seen.wants_checks is wants_checks
    assert (seen.answer_format.schema if seen.answer_format else None) == schema


def test_a_schema_too_large_to_check_is_skipped_not_parsed():
    schema = b'{"enum": [' + b'"a",' * (MAX_SCHEMA_BYTES // 4) + b'"a"]}'
    body = b'{"model": "m", "response_format": {"type": "json_schema", "json_schema": {"schema": ' + schema + b"}}}"
    seen = peek(body)
    assert seen.answer_format is not None and seen.answer_format.schema_skipped
    assert seen.answer_format.schema is None


def test_a_body_of_many_small_values_is_not_parsed_into_objects():
    """The issue's shape: 4 MiB of `[{},{},...]` in a field nobody reads. Parsed, it was 25x its
    size in Python objects; scanned, it allocates almost nothing beyond the copy sent upstream."""
    body = b'{"model": "m", "extra": [' + b"{}," * 1_300_000 + b"{}]}"
    tracemalloc.start()
    try:
        seen = peek(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(seen.body.for_model("m")) < len(body) + 64
    assert peak < 2 * len(body)  # the copy for upstream (and the encoder's growing buffer)
