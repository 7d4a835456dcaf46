"""The gateway end to end: the official openai SDK -> gateway -> simulators, over loopback."""

from __future__ import annotations

import asyncio
import threading

import httpx
import openai
import pytest

from router.app import create_app
from tests.conftest import dedicated_profile, gateway_config, serverless_profile
from tests.servers import Sim, ThreadServer, wait_until
from tidegate.sim.profile import Faults

MESSAGES = [{"role": "user", "content": "Hello"}]


def client(gateway: ThreadServer, **kw: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, **kw)  # type: ignore[arg-type]


def test_non_stream_chat_answers_from_dedicated_with_route_headers(gateway, dedicated_sim):
    raw = client(gateway).chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, max_tokens=5
    )
    reply = raw.parse()
    assert reply.choices[0].message.content.split() == ["the", "tide", "gate", "routes", "every"]
    assert reply.usage.completion_tokens == 5
    assert reply.model == "m"  # the name asked for (response_model: requested) ...
    assert raw.headers["x-tidegate-upstream-model"] == "upstream-ded"  # ... the upstream's id here
    assert raw.headers["x-tidegate-route"] == "ded"
    assert raw.headers["x-tidegate-kind"] == "dedicated"
    assert raw.headers["x-tidegate-reason"] == "baseline"
    assert dedicated_sim.stats()["completed"] == 1


def test_stream_relays_every_chunk_and_hides_the_usage_chunk_it_asked_for(gateway):
    chunks = list(
        client(gateway).chat.completions.create(model="m", messages=MESSAGES, max_tokens=4, stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.split() == ["the", "tide", "gate", "routes"]
    assert all(c.choices for c in chunks), "a usage-only chunk leaked to a client that did not ask"


def test_stream_keeps_the_usage_chunk_when_the_client_asked(gateway):
    chunks = list(
        client(gateway).chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=3, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 3


def test_async_client_streams_and_not(gateway):
    async def run() -> tuple[str, str]:
        async with openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0) as c:
            plain = await c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
            stream = await c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2, stream=True)
            streamed = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
            return plain.choices[0].message.content, streamed

    plain, streamed = asyncio.run(run())
    assert plain == streamed == "the tide "


def test_completions_embeddings_responses_and_models(gateway):
    c = client(gateway)
    assert c.completions.create(model="m", prompt="x", max_tokens=2).choices[0].text == "the tide "
    assert len(c.embeddings.create(model="m", input=["a", "b", "c"]).data) == 3
    assert c.responses.create(model="m", input="hi", max_output_tokens=2).output_text == "the tide "
    events = [e.type for e in c.responses.create(model="m", input="hi", max_output_tokens=2, stream=True)]
    assert events[0] == "response.created" and events[-1] == "response.incomplete"  # cut at 2 tokens
    assert [m.id for m in c.models.list()] == ["m"]


def test_spills_to_serverless_when_dedicated_is_saturated():
    slow = dedicated_profile(max_concurrency=2, time_scale=1.0, itl_s=0.05)
    with (
        Sim(slow) as ded,
        Sim(serverless_profile()) as sl,
        # timeouts a loaded machine cannot reach: a dedicated attempt that timed out would fail
        # over to serverless and leave the pool under-used, which is not what this test is about
        ThreadServer(create_app(gateway_config(ded, [sl], timeouts="{ttft_s: 30, idle_s: 30}"))) as gw,
    ):
        routes: list[tuple[str, str]] = []
        lock = threading.Lock()

        def one() -> None:
            raw = client(gw).chat.completions.with_raw_response.create(
                model="m", messages=MESSAGES, max_tokens=10
            )
            with lock:
                routes.append((raw.headers["x-tidegate-route"], raw.headers["x-tidegate-reason"]))

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert len(routes) == 8
        assert ded.stats()["max_in_flight"] <= 2
        assert routes.count(("ded", "baseline")) == ded.stats()["completed"] >= 2, routes
        assert routes.count(("sl0", "saturated")) == sl.stats()["completed"] >= 1, routes
        assert len(routes) == ded.stats()["completed"] + sl.stats()["completed"]


def _error(response: httpx.Response) -> dict[str, object]:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"messages": []}', 400, None),
        (b'{"model": 5}', 400, None),
        (b'{"model": "m", "stream": "yes"}', 400, None),
        (b'{"model": "gpt-nope", "messages": []}', 404, "model_not_found"),
    ],
)
def test_bad_requests_get_openai_errors(gateway, body, status, code):
    response = httpx.post(
        gateway.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == status
    error = _error(response)
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code


def test_body_over_the_limit_is_refused_with_413(dedicated_sim):
    config = gateway_config(dedicated_sim, [])
    config = config.model_copy(update={"limits": config.limits.model_copy(update={"max_body_bytes": 1000})})
    with ThreadServer(create_app(config)) as gw:
        big = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 2000 + b'"}]}'
        response = httpx.post(gw.url + "/v1/chat/completions", content=big)
        assert response.status_code == 413
        chunked = httpx.post(gw.url + "/v1/chat/completions", content=iter([big[:600], big[600:]]))
        assert chunked.status_code == 413
        assert _error(chunked)["code"] == "request_too_large"
    assert dedicated_sim.stats()["requests"] == 0


def test_unknown_path_and_method_get_openai_errors(gateway):
    missing = httpx.post(gateway.url + "/v1/nothing-here", json={})
    assert missing.status_code == 404 and _error(missing)["code"] == "unknown_url"
    wrong = httpx.get(gateway.url + "/v1/chat/completions")
    assert wrong.status_code == 405 and _error(wrong)["code"] == "method_not_allowed"


def test_unreachable_upstream_is_a_502():
    with Sim(serverless_profile()) as gone:
        pass  # stopped: its port now refuses connections
    with ThreadServer(create_app(gateway_config(None, [gone]))) as gw:
        with pytest.raises(openai.APIStatusError) as caught:
            client(gw).chat.completions.create(model="m", messages=MESSAGES)
        assert caught.value.status_code == 502
        assert caught.value.body["code"] == "upstream_unreachable"
        assert caught.value.response.headers["x-tidegate-attempts"] == "3"


def test_stalled_upstream_is_a_504():
    stalling = serverless_profile(time_scale=1.0, faults=Faults(stall_rate=1.0, stall_s=5.0))
    with Sim(stalling) as sl:
        config = gateway_config(None, [sl], retry="{attempts: 1}")
        with ThreadServer(create_app(config)) as gw:
            with pytest.raises(openai.APIStatusError) as caught:
                client(gw).chat.completions.create(model="m", messages=MESSAGES, stream=True)
            assert caught.value.status_code == 504
            assert caught.value.body["code"] == "upstream_timeout"


def test_fails_over_to_serverless_when_dedicated_answers_503(dedicated_sim, serverless_sims):
    dedicated_sim.configure(faults={"error_rate": 1.0})
    with ThreadServer(create_app(gateway_config(dedicated_sim, serverless_sims))) as gw:
        raw = client(gw).chat.completions.with_raw_response.create(model="m", messages=MESSAGES, stream=True)
        assert raw.headers["x-tidegate-route"] == "sl0"
        assert raw.headers["x-tidegate-reason"] == "failover"
        assert raw.headers["x-tidegate-attempts"] == "2"
        assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert sum(dedicated_sim.stats()["faults"].values()) == 1


def test_upstream_client_error_is_relayed_without_retry(dedicated_sim, gateway):
    before = dedicated_sim.stats()["requests"]
    # no `messages`: the gateway forwards it, the simulator refuses it as vLLM does (400)
    response = httpx.post(gateway.url + "/v1/chat/completions", content=b'{"model": "m", "stream": false}')
    assert response.status_code == 400
    assert "messages" in response.json()["error"]["message"]  # the upstream's own words
    assert response.headers["x-tidegate-outcome"] == "client_error"
    assert response.headers["x-tidegate-attempts"] == "1"
    assert dedicated_sim.stats()["requests"] == before + 1  # not retried, not failed over


def test_cut_stream_ends_with_an_error_event(dedicated_sim, serverless_sims):
    dedicated_sim.configure(faults={"cut_rate": 1.0})
    with ThreadServer(create_app(gateway_config(dedicated_sim, serverless_sims))) as gw:
        stream = client(gw).chat.completions.create(model="m", messages=MESSAGES, max_tokens=10, stream=True)
        received = []
        with pytest.raises(openai.APIError) as caught:
            for chunk in stream:
                received.append(chunk)
        assert "stream interrupted" in str(caught.value)
        assert received, "the first half of the stream reached the client"
    wait_until(lambda: dedicated_sim.stats()["in_flight"] == 0)


def test_client_disconnect_mid_stream_releases_the_dedicated_slot():
    slow = dedicated_profile(max_concurrency=1, time_scale=1.0, itl_s=0.05)
    with (
        Sim(slow) as ded,
        Sim(serverless_profile()) as sl,
        ThreadServer(create_app(gateway_config(ded, [sl]))) as gw,
    ):
        c = client(gw)
        stream = c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=400, stream=True)
        next(iter(stream))
        stream.close()  # the client goes away after its first chunk
        wait_until(lambda: ded.stats()["cancelled"] == 1)
        raw = c.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, max_tokens=1)
        assert raw.headers["x-tidegate-route"] == "ded", "the slot of the gone client was not released"


def test_client_disconnect_during_a_non_stream_request_cancels_the_upstream_call():
    slow = dedicated_profile(max_concurrency=1, time_scale=1.0, itl_s=0.05)  # 400 tokens: 20 s
    with (
        Sim(slow) as ded,
        Sim(serverless_profile()) as sl,
        ThreadServer(create_app(gateway_config(ded, [sl]))) as gw,
    ):
        impatient = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=0.5)
        with pytest.raises(openai.APITimeoutError):
            impatient.chat.completions.create(model="m", messages=MESSAGES, max_tokens=400)
        wait_until(lambda: ded.stats()["cancelled"] == 1, timeout=10)  # long before its 20 s
        raw = client(gw).chat.completions.with_raw_response.create(model="m", messages=MESSAGES, max_tokens=1)
        assert raw.headers["x-tidegate-route"] == "ded", "the slot of the gone client was not released"


def test_health_and_readiness(gateway):
    assert httpx.get(gateway.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(gateway.url + "/readyz")
    assert ready.status_code == 200 and ready.json()["state_store"] == "memory"


def test_api_keys_are_required_when_configured(dedicated_sim):
    config = gateway_config(dedicated_sim, [])
    config = config.model_copy(update={"auth": config.auth.model_copy(update={"api_keys": ("k-1", "k-2")})})
    with ThreadServer(create_app(config)) as gw:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic k-1"}):
            response = httpx.post(gw.url + "/v1/chat/completions", json={"model": "m"}, headers=headers)
            assert response.status_code == 401 and _error(response)["code"] == "invalid_api_key"
        ok = openai.OpenAI(base_url=gw.url + "/v1", api_key="k-2", max_retries=0)
        assert ok.chat.completions.create(model="m", messages=MESSAGES).choices
    assert dedicated_sim.stats()["requests"] == 1


def test_upstream_gets_its_own_key_and_model_never_the_clients(dedicated_sim):
    seen: list[httpx.Request] = []

    class Spy(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            seen.append(request)
            await request.aread()
            return httpx.Response(200, json={"choices": [], "usage": {"completion_tokens": 1}})

    config = gateway_config(dedicated_sim, [])
    model = config.models["m"]
    ded = model.dedicated[0].model_copy(update={"api_key": "upstream-secret"})
    config = config.model_copy(update={"models": {"m": model.model_copy(update={"dedicated": (ded,)})}})
    with ThreadServer(create_app(config, transport=lambda endpoint: Spy())) as gw:
        httpx.post(
            gw.url + "/v1/chat/completions",
            json={"model": "m", "messages": []},
            headers={
                "authorization": "Bearer client-key",
                "connection": "keep-alive",
                "x-tidegate-session": "s1",
                "x-custom": "kept",
            },
        )
    (request,) = seen
    assert request.headers["authorization"] == "Bearer upstream-secret"
    assert request.headers["x-custom"] == "kept"
    assert "x-tidegate-session" not in request.headers
    assert b'"model":"upstream-ded"' in request.content
