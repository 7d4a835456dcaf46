"""Telemetry: the span tree and GenAI attributes (in-memory exporter), OTel and Prometheus
metrics that count what was sent, and the overhead header."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from router.app import create_app
from router.record.telemetry import Telemetry, otlp_configured
from tests.conftest import dedicated_profile, gateway_config, serverless_profile
from tests.servers import Sim, ThreadServer, wait_until

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


@pytest.fixture
def traced() -> Iterator[tuple[ThreadServer, Sim, Sim, InMemorySpanExporter, InMemoryMetricReader]]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    telemetry = Telemetry(tracer_provider, MeterProvider(metric_readers=[reader]))
    with (
        Sim(dedicated_profile()) as ded,
        Sim(serverless_profile()) as sl,
        ThreadServer(create_app(gateway_config(ded, [sl]), telemetry=telemetry)) as gw,
    ):
        yield gw, ded, sl, exporter, reader


def test_a_failed_over_request_is_one_server_span_with_a_client_span_per_attempt(traced):
    gw, ded, sl, exporter, _ = traced
    ded.configure(faults={"error_rate": 1.0})
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    for _ in client.chat.completions.create(
        model="m", messages=[], max_tokens=3, stream=True, extra_headers={"traceparent": traceparent}
    ):
        pass
    wait_until(lambda: len(exporter.get_finished_spans()) == 3, timeout=5)
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.kind is SpanKind.SERVER]
    attempts = sorted(
        (s for s in spans if s.kind is SpanKind.CLIENT), key=lambda s: s.attributes["tidegate.attempt"]
    )
    # the client's trace is continued
    assert format(root.context.trace_id, "032x") == CLIENT_TRACE
    assert format(root.parent.span_id, "016x") == CLIENT_SPAN
    assert root.name == "chat m"
    assert [a.parent.span_id for a in attempts] == [root.context.span_id] * 2
    assert root.attributes["gen_ai.operation.name"] == "chat"
    assert root.attributes["gen_ai.request.model"] == "m"
    assert root.attributes["gen_ai.response.model"] == "upstream-sl0"
    assert root.attributes["gen_ai.usage.output_tokens"] == 3
    assert root.attributes["gen_ai.usage.input_tokens"] > 0
    assert (root.attributes["tidegate.route"], root.attributes["tidegate.kind"]) == ("sl0", "serverless")
    assert (root.attributes["tidegate.reason"], root.attributes["tidegate.outcome"]) == (
        "failover",
        "failed_over_ok",
    )
    first, second = attempts
    assert (first.attributes["tidegate.route"], first.status.status_code) == ("ded", StatusCode.ERROR)
    assert first.attributes["error.type"] == "UpstreamStatus"
    assert (second.attributes["tidegate.route"], second.status.status_code) == ("sl0", StatusCode.UNSET)
    assert second.attributes["server.address"] == "127.0.0.1"
    # the upstream got the attempt's context, in the client's trace
    assert sl.stats()["last_traceparent"].split("-")[1:3] == [
        CLIENT_TRACE,
        format(second.context.span_id, "016x"),
    ]


def test_otel_ttft_histogram_counts_every_stream(traced):
    gw, _, _, _, reader = traced
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    for _ in range(4):
        for _ in client.chat.completions.create(model="m", messages=[], max_tokens=2, stream=True):
            pass

    def points() -> list:
        return [
            point
            for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            if metric.name == "gen_ai.server.time_to_first_token"
            for point in metric.data.data_points
        ]

    # a request is recorded when its response has ended, just after the client read it
    wait_until(lambda: sum(p.count for p in points()) == 4, timeout=5)
    assert all(p.sum > 0 for p in points())


def test_prometheus_metrics_parse_and_count_the_requests_sent(gateway):
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    for i in range(5):
        client.chat.completions.create(model="m", messages=[], max_tokens=2, stream=i % 2 == 0)

    def families() -> dict:
        return {f.name: f for f in text_string_to_metric_families(httpx.get(gateway.url + "/metrics").text)}

    def count(family: dict, name: str) -> float:
        return (
            sum(s.value for s in family[name].samples if s.name.endswith("_count")) if name in family else 0
        )

    # a request is recorded when its response has ended, just after the client read it
    wait_until(lambda: count(families(), "tidegate_e2e_seconds") == 5, timeout=5)
    parsed = families()
    e2e_count = count(parsed, "tidegate_e2e_seconds")
    ttft_count = count(parsed, "tidegate_ttft_seconds")
    requests = {
        s.labels["outcome"]: s.value for s in parsed["tidegate_requests"].samples if s.name.endswith("_total")
    }
    assert e2e_count == 5 and ttft_count == 3  # TTFT is a stream's
    assert requests == {"first_try": 5}
    assert {s.labels["pool"]: s.value for s in parsed["tidegate_in_flight"].samples} == {"ded": 0}
    assert parsed["tidegate_state_store_degraded"].samples[0].value == 0


def test_every_answer_says_how_long_the_gateway_itself_took(gateway):
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="m", messages=[], max_tokens=2)
    overhead = float(raw.headers["x-tidegate-overhead-ms"])
    assert 0 <= overhead < raw.elapsed.total_seconds() * 1000


@pytest.mark.parametrize(
    ("env", "configured"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "x"}, True),
    ],
)
def test_otlp_export_only_when_the_standard_variables_ask(env, configured):
    assert otlp_configured(env) is configured
