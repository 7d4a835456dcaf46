"""Property-based fuzzing of the public endpoints (hypothesis): whatever a client sends —
bytes that are not JSON, JSON of every shape, bodies nested up to 1000 deep, numbers that
overflow or are not numbers (in `max_tokens`, `n`, `best_of`, ...), valid-looking requests
with wrong types or absurd values, odd paths, methods and header values — the gateway answers within its
timeout with a 2xx, or a 4xx carrying an OpenAI-style error body. Never a 500, never a hang.
The upstreams are healthy simulators, so no 5xx is excusable.

In the test command the examples are derandomized (300, the same every run, so CI is
reproducible); `TIDEGATE_FUZZ_RANDOM=1 TIDEGATE_FUZZ_EXAMPLES=5000 make test` explores anew."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.app import create_app
from tests.conftest import dedicated_profile, gateway_config, serverless_profile
from tests.matrix import MatrixRow, settled_value
from tests.servers import Sim, ThreadServer

PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/models",
    "/v1/chat/completions/extra",
    "/v1/unknown",
    "/admin/models/m",
    "/admin/models/m/canary",
    "/admin/models/m/parity",
    "/admin/models/m/probe",
    "/admin/keys",
    "/admin/keys/x/rotate",
    "/healthz",
    "/readyz",
    "/",
]
FIELDS = [
    "model",
    "messages",
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "user",
    "stream_options",
    "input",
    "prompt",
    "n",
    "best_of",
    "temperature",
    "top_logprobs",
]
# numbers no JSON library agrees on: overflow, NaN spellings, huge integers, negative zero
ODD_NUMBERS = [
    b"1e400",
    b"-1e400",
    b"NaN",
    b"Infinity",
    b"-0",
    b"-0.0",
    b"1" * 400,
    b"0." + b"0" * 300 + b"1",
]
ODD_NUMBERS += [b"18446744073709551616", b"-9223372036854775809", b"5000", b"1e-400", b"4.9e-324"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
request_like = st.fixed_dictionaries(
    {"model": st.sampled_from(["m", "", "nope", "M"]) | json_values},
    optional={name: json_values | st.sampled_from([True, 0, -1, 10**12, "x", [], {}]) for name in FIELDS[1:]},
)


def nested(depth: int, opener: bytes) -> bytes:
    closer = b"]" if opener == b"[" else b"}"
    inner = b"[" * depth + b"]" * depth if opener == b"[" else b'{"a":' * depth + b"1" + closer * depth
    return b'{"model": "m", "messages": [], "meta": ' + inner + b"}"


nested_bodies = st.builds(nested, st.integers(1, 1000), st.sampled_from([b"[", b"{"]))
odd_number_bodies = st.builds(
    lambda field, number, stream: (
        b'{"model": "m", "messages": [], "%s": %s, "stream": %s}' % (field.encode(), number, stream)
    ),
    st.sampled_from(["max_tokens", "max_completion_tokens", "n", "best_of", "temperature", "top_logprobs"]),
    st.sampled_from(ODD_NUMBERS),
    st.sampled_from([b"true", b"false"]),
)
bodies = st.one_of(
    st.binary(max_size=200),
    nested_bodies,
    odd_number_bodies,
    json_values.map(orjson.dumps),
    request_like.map(orjson.dumps),
    st.just(b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}'),  # lone surrogate
    st.just(b'{"model": "m"' + b" " * 1000),  # truncated
)
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)


@pytest.fixture(scope="module")
def fuzz_gateway() -> Iterator[ThreadServer]:
    with Sim(dedicated_profile()) as ded, Sim(serverless_profile()) as sl:
        config = gateway_config(ded, [sl])
        config = config.model_copy(
            update={
                "auth": config.auth.model_copy(update={"admin_key": "adm"}),
                "limits": config.limits.model_copy(update={"max_body_bytes": 4096}),
            }
        )
        app = create_app(config)
        with ThreadServer(app) as gw:
            gw.app = app  # type: ignore[attr-defined]
            yield gw


SEEN = MatrixRow("fuzzer (hypothesis, public endpoints)")


def test_the_gateway_never_answers_5xx_or_hangs_and_no_input_holds_a_slot(fuzz_gateway, fault_matrix):
    """The property, then what it sent and that no input left a dedicated slot held: one test,
    so the check runs after the property on the same worker whatever xdist does."""

    @settings(
        max_examples=int(os.environ.get("TIDEGATE_FUZZ_EXAMPLES", "300")),
        deadline=None,
        derandomize=os.environ.get("TIDEGATE_FUZZ_RANDOM") != "1",
    )
    @given(
        method=st.sampled_from(["POST", "GET", "PUT", "DELETE", "PATCH"]),
        path=st.sampled_from(PATHS)
        | st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=30).map(lambda p: "/" + p),
        body=bodies,
        content_type=st.sampled_from(["application/json", "text/plain", "", "application/json; charset=latin-1"])
        | header_text,
        authorization=st.none() | header_text.map(lambda t: "Bearer " + t) | st.just("Bearer adm"),
        session=st.none() | header_text,
    )
    def never_5xx(method, path, body, content_type, authorization, session):
        headers = {"content-type": content_type}
        if authorization is not None:
            headers["authorization"] = authorization
        if session is not None:
            headers["x-tidegate-session"] = session
        try:
            response = httpx.request(method, fuzz_gateway.url + path, content=body, headers=headers, timeout=15)
        except (httpx.InvalidURL, httpx.LocalProtocolError):
            return  # the client library refused to send it; nothing reached the gateway
        SEEN.requests += 1
        assert response.status_code < 500, (response.status_code, response.text[:300])
        if response.status_code >= 400:
            SEEN.clean_errors += 1
            error = response.json()["error"]
            assert isinstance(error["message"], str) and error["message"]
            assert set(error) >= {"message", "type", "param", "code"}
        else:
            SEEN.succeeded += 1

    never_5xx()
    store = fuzz_gateway.app.state.store
    SEEN.leases_after = settled_value(lambda: sum(store.snapshot().in_flight.values()))
    fault_matrix.append(SEEN)
    assert SEEN.requests > 100
    assert SEEN.leases_after == 0
