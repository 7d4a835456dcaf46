"""Every refusal tells the official openai SDK the truth (issue 26): a request no upstream saw
is retryable, after the expected wait; a stream cut mid-way is `upstream_stream_cut` in the
SDK's error, the record and the metrics; a Responses stream ends in its own API's error shape;
every answer and refusal carries an `x-request-id`; and an oversized body is a 413 the SDK
reads, not a connection error."""

from __future__ import annotations

import re
import threading
import time

import httpx
import openai
import orjson
import pytest

from router.app import create_app
from router.config import parse_config
from tests.conftest import serverless_profile
from tests.servers import Sim, ThreadServer, wait_until
from tidegate.sim.profile import Faults, Kind, SimProfile

MESSAGES = [{"role": "user", "content": "hi"}]


def dedicated_only(sim: Sim) -> str:
    return (
        "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
        f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{sim.base_url}', model: d, max_concurrency: 1}}]\n"
    )


def serverless_only(sim: Sim) -> str:
    return (
        "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
        f"    serverless: [{{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sim.base_url}', model: s}}]\n"
    )


def hold_the_slot(url: str, tokens: int) -> threading.Thread:
    """A stream that holds the pool's one slot for about `tokens` x 50 ms."""

    def run() -> None:
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        for _ in client.chat.completions.create(model="m", messages=MESSAGES, stream=True, max_tokens=tokens):
            pass

    holder = threading.Thread(target=run, daemon=True)
    holder.start()
    return holder


def test_a_request_no_upstream_saw_is_retryable_every_time_and_the_sdk_gets_it_served():
    slow = SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=8, itl_s=0.05, seed=1)
    with Sim(slow) as ded, ThreadServer(create_app(parse_config(dedicated_only(ded), {}))) as gw:
        url = gw.url + "/v1"
        holder = hold_the_slot(url, tokens=60)
        wait_until(lambda: ded.stats()["running"] == 1)
        refused = []
        no_retries = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        for _ in range(4):  # the retry budget once made the second and later ones final
            with pytest.raises(openai.APIStatusError) as caught:
                no_retries.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
            refused.append(caught.value)
        holder.join(10)
        holder = hold_the_slot(url, tokens=16)  # ~0.8 s: within the SDK's wait for a retry
        wait_until(lambda: ded.stats()["running"] == 1)
        retrying = openai.OpenAI(base_url=url, api_key="x", max_retries=2)
        served = retrying.chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, max_tokens=2
        )
        holder.join(10)
    for error in refused:
        headers = error.response.headers
        assert error.status_code == 503 and error.code == "no_capacity"
        assert headers["x-should-retry"] == "true" and int(headers["retry-after"]) >= 1
        assert headers["x-tidegate-attempts"] == "0"
        assert error.request_id and error.request_id == headers["x-tidegate-request-id"]
    assert served.http_response.status_code == 200
    assert int(served.http_response.request.headers["x-stainless-retry-count"]) >= 1  # the SDK retried


def test_a_stream_cut_mid_way_is_upstream_stream_cut_for_the_sdk_the_record_and_the_metrics(caplog):
    cutting = serverless_profile(faults=Faults(cut_rate=1.0))
    with (
        caplog.at_level("INFO", logger="tidegate.access"),
        Sim(cutting) as sl,
        ThreadServer(create_app(parse_config(serverless_only(sl), {}))) as gw,
    ):
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIError) as caught:
            for _ in client.chat.completions.create(model="m", messages=MESSAGES, stream=True, max_tokens=40):
                pass
        wait_until(lambda: any("upstream_stream_cut" in r.getMessage() for r in caplog.records))
        metrics = httpx.get(gw.url + "/metrics").text
    records = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "tidegate.access"]
    assert records[-1]["measures"]["code"] == "upstream_stream_cut"
    assert records[-1]["outcome"] == "failed_mid_stream"
    body = caught.value.body
    assert isinstance(body, dict) and body.get("code") == "upstream_stream_cut"
    found = re.search(r'tidegate_errors_total\{[^}]*code="upstream_stream_cut"[^}]*\} (\d+)', metrics)
    assert found is not None and int(float(found.group(1))) == 1


def test_a_responses_stream_ends_in_the_responses_error_shape():
    cutting = serverless_profile(faults=Faults(cut_rate=1.0))
    with Sim(cutting) as sl, ThreadServer(create_app(parse_config(serverless_only(sl), {}))) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        events = list(client.responses.create(model="m", input="hi", stream=True, max_output_tokens=40))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-2:] == ["error", "response.failed"]
    error, failed = events[-2], events[-1]
    assert error.code == "upstream_stream_cut" and error.message
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)  # numbered on
    assert failed.response.status == "failed" and failed.response.id == events[0].response.id


def test_every_answer_and_refusal_carries_an_x_request_id():
    with (
        Sim(serverless_profile()) as sl,
        ThreadServer(create_app(parse_config(serverless_only(sl), {}))) as gw,
    ):
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        answer = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
        with pytest.raises(openai.NotFoundError) as unknown:
            client.chat.completions.create(model="nope", messages=MESSAGES)
    assert answer._request_id and answer._request_id.startswith("req_")
    assert unknown.value.request_id and unknown.value.request_id.startswith("req_")


def test_an_oversized_body_is_a_413_the_sdk_reads_not_a_connection_error():
    with (
        Sim(serverless_profile()) as sl,
        ThreadServer(create_app(parse_config(serverless_only(sl), {}))) as gw,
    ):
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=2)
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * (5 << 20)}])
        took = time.monotonic() - started
        upstream_hits = sl.stats()["requests"]
    assert caught.value.status_code == 413 and caught.value.code == "request_too_large"
    assert took < 30  # answered, not retried as a connection error until a timeout
    assert upstream_hits == 0
