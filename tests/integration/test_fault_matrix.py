"""The fault matrix: each case runs a bounded burst through a real gateway in front of real
simulators (and a real Redis where the case needs one), then checks that every request got a
success or an OpenAI-style error within its timeout, that in-flight is back to 0 in the
store, and that the outcomes the gateway recorded match what the simulators saw. Each case
adds a row to the table printed at the end of the test run."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest
import redis

from router.app import create_app
from router.config import GatewayConfig, parse_config
from tests.conftest import dedicated_profile, serverless_profile
from tests.matrix import MatrixRow, burst, one_request, settled_value
from tests.servers import CliProcess, RedisServer, Sim, ThreadServer, wait_until
from tidegate.sim.profile import Kind, SimProfile

COUNT, CONCURRENCY = 16, 4


def config_text(
    ded_url: str, sl_url: str, *, extra: str = "", model_extra: str = "", ded_ttft_s: float = 0.5
) -> str:
    timeouts = f"timeouts: {{connect_s: 1, ttft_s: {ded_ttft_s:g}, idle_s: 2, total_s: 20}}"
    # serverless is the healthy side in every case here: a tight first-byte timeout would only
    # turn a loaded machine's slow answer into a second serverless call (seen once in a full run)
    sl_timeouts = "timeouts: {connect_s: 1, ttft_s: 5, idle_s: 2, total_s: 20}"
    if "auth:" not in extra:
        extra += "auth: {allow_anonymous: true}\n"
    return (
        f"{extra}models:\n  m:\n"
        "    retry: {attempts: 3, backoff_ms: 10}\n"
        f"{model_extra}"
        f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded_url}', model: d, max_concurrency: 4, {timeouts}}}]\n"
        f"    serverless: [{{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl_url}', model: s, {sl_timeouts}}}]\n"
    )


@contextmanager
def gateway(config: GatewayConfig) -> Iterator[tuple[ThreadServer, object]]:
    app = create_app(config)
    with ThreadServer(app) as server:
        yield server, app


def settle(app: object, row: MatrixRow) -> Counter[str]:
    """After a burst: in-flight back to 0 in the store, and one recorded outcome per request."""
    state = app.state  # type: ignore[attr-defined]
    row.leases_after = settled_value(lambda: sum(state.store.snapshot().in_flight.values()))
    wait_until(lambda: sum(state.recorder.outcomes.values()) == row.requests, timeout=10)
    return Counter(state.recorder.outcomes)


def check(row: MatrixRow, fault_matrix: list[MatrixRow]) -> None:
    fault_matrix.append(row)
    assert row.requests == COUNT
    assert row.lost == 0, row.lost_detail
    assert row.leases_after in (0, None)


@pytest.mark.parametrize(
    ("case", "faults", "stream"),
    [
        ("dedicated returns 503s", {"error_rate": 1.0}, False),
        ("dedicated answers 429 + Retry-After", {"rate_limit_rate": 1.0, "retry_after_s": 0.05}, True),
        ("dedicated stalls before the first byte", {"stall_rate": 1.0, "stall_s": 5.0}, True),
    ],
)
def test_a_failing_dedicated_endpoint_fails_over_and_loses_nothing(case, faults, stream, fault_matrix):
    with Sim(dedicated_profile(time_scale=1.0, itl_s=0.001)) as ded, Sim(serverless_profile()) as sl:
        ded.configure(faults=faults)
        with gateway(parse_config(config_text(ded.base_url, sl.base_url), {})) as (gw, app):
            row = burst(case, COUNT, CONCURRENCY, lambda i: one_request(gw.url + "/v1", stream=stream))
            outcomes = settle(app, row)
        served_by_serverless = sl.stats()["completed"]
    check(row, fault_matrix)
    assert row.succeeded == COUNT
    assert served_by_serverless == COUNT
    # every request failed over, or skipped dedicated once its circuit opened
    assert outcomes["failed_over_ok"] + outcomes["first_try"] == COUNT
    assert outcomes["failed_over_ok"] >= 1


def test_dedicated_refusing_connections(fault_matrix):
    # A port bound but never listened on refuses every connection, and nobody else can take it
    # meanwhile (a free port released could be taken by another test's server on a busy machine)
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))
    closed_port = refusing.getsockname()[1]
    with refusing, Sim(serverless_profile()) as sl:
        config = parse_config(config_text(f"http://127.0.0.1:{closed_port}/v1", sl.base_url), {})
        with gateway(config) as (gw, app):
            row = burst(
                "dedicated refuses connections",
                COUNT,
                CONCURRENCY,
                lambda i: one_request(gw.url + "/v1", stream=False),
            )
            outcomes = settle(app, row)
        served = sl.stats()["completed"]
    check(row, fault_matrix)
    assert row.succeeded == COUNT == served
    assert outcomes["failed_over_ok"] >= 1, outcomes


def test_stream_cut_mid_way_ends_with_an_error_event(fault_matrix):
    with Sim(dedicated_profile()) as ded, Sim(serverless_profile()) as sl:
        ded.configure(faults={"cut_rate": 1.0})
        # a generous first-event timeout: on a loaded machine a slow first event would fail
        # over to serverless while the simulator still reached (and counted) the cut
        config = parse_config(config_text(ded.base_url, sl.base_url, ded_ttft_s=5), {})
        with gateway(config) as (gw, app):
            row = burst(
                "stream cut mid-way",
                COUNT,
                CONCURRENCY,
                lambda i: one_request(gw.url + "/v1", stream=True, max_tokens=10),
            )
            outcomes = settle(app, row)
        cut = ded.stats()["faults"].get("cut", 0)
        served_by_serverless = sl.stats()["completed"]
    check(row, fault_matrix)
    # never retried after the first byte: each cut stream ends with an error event; once the
    # breaker has seen enough cuts, dedicated is skipped and serverless serves the rest
    assert row.clean_errors == cut == outcomes["failed_mid_stream"] >= 1
    assert row.succeeded == served_by_serverless == COUNT - cut


def test_clients_leaving_mid_stream_free_their_slots(fault_matrix):
    slow = dedicated_profile(time_scale=1.0, itl_s=0.02, max_concurrency=4)

    def leave_after_first_chunk(url: str) -> str:
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=20)
        stream = client.chat.completions.create(model="m", messages=[], max_tokens=500, stream=True)
        next(iter(stream))
        stream.close()
        return "gone"

    with Sim(slow) as ded, Sim(serverless_profile()) as sl:
        with gateway(parse_config(config_text(ded.base_url, sl.base_url), {})) as (gw, app):
            row = burst(
                "client disconnects mid-stream",
                COUNT,
                CONCURRENCY,
                lambda i: leave_after_first_chunk(gw.url + "/v1"),
            )
            outcomes = settle(app, row)
        wait_until(lambda: ded.stats()["in_flight"] == 0, timeout=10)
        cancelled = ded.stats()["cancelled"] + sl.stats()["cancelled"]
    check(row, fault_matrix)
    assert row.client_gone == COUNT
    assert outcomes["client_gone"] == COUNT
    assert cancelled >= 1  # the upstream side of each stream was cancelled, not left running


def test_wrong_or_missing_api_key(fault_matrix):
    with Sim(dedicated_profile()) as ded, Sim(serverless_profile()) as sl:
        config = parse_config(
            config_text(ded.base_url, sl.base_url, extra="auth: {api_keys: [right-key]}\n"), {}
        )
        with gateway(config) as (gw, _):
            keys = ["wrong-key", None, "right-key-but-longer", "Right-Key"]

            def send(i: int) -> str:
                key = keys[i % 4]
                if key is not None:
                    return one_request(gw.url + "/v1", stream=False, api_key=key)
                answer = httpx.post(gw.url + "/v1/chat/completions", json={"model": "m", "messages": []})
                return "error" if answer.status_code == 401 and "error" in answer.json() else "lost: no 401"

            row = burst("wrong or missing API key", COUNT, CONCURRENCY, send)
            status = httpx.post(gw.url + "/v1/chat/completions", json={"model": "m"}).status_code
        upstream_requests = ded.stats()["requests"] + sl.stats()["requests"]
    check(row, fault_matrix)
    assert row.clean_errors == COUNT and status == 401
    assert upstream_requests == 0


def test_redis_killed_and_restarted_mid_burst(fault_matrix):
    own_redis = RedisServer().start()
    try:
        with Sim(dedicated_profile(time_scale=1.0, itl_s=0.01)) as ded, Sim(serverless_profile()) as sl:
            extra = f"state: {{redis_url: '{own_redis.url}', lease_ttl_s: 2, fallback_share: 0.5}}\n"
            with gateway(parse_config(config_text(ded.base_url, sl.base_url, extra=extra), {})) as (gw, app):
                store = app.state.store  # type: ignore[attr-defined]
                done = threading.Event()

                def send(i: int) -> str:
                    if i == COUNT // 4:
                        own_redis.stop()  # Redis dies a quarter into the burst
                        wait_until(lambda: store.degraded, timeout=10)
                    if i == COUNT // 2:
                        own_redis.start()  # ... and comes back halfway
                        wait_until(lambda: not store.degraded, timeout=10)
                    return one_request(gw.url + "/v1", stream=True, max_tokens=20)

                row = burst("Redis killed and restarted mid-burst", COUNT, 1, send)
                done.set()
                settle(app, row)
                # back to ready by itself (a refresh on a connection that died with the old
                # Redis can flip it to degraded for one more refresh: poll, with a deadline)
                wait_until(lambda: httpx.get(gw.url + "/readyz").json()["status"] == "ready", timeout=10)
                ready = httpx.get(gw.url + "/readyz").json()
            leases = redis.Redis(port=own_redis.port).zcard(store.leases.key("ded"))
            max_seen = ded.stats()["max_in_flight"]
    finally:
        own_redis.stop()
    row.leases_after = leases
    check(row, fault_matrix)
    assert row.succeeded == COUNT
    assert store.fallback_admissions >= 1  # some were admitted locally while Redis was away
    assert ready["status"] == "ready" and ready["fallback_admissions"] == store.fallback_admissions
    assert leases == 0
    assert max_seen <= 4


def test_a_gateway_sigterm_mid_burst_lets_in_flight_streams_finish(tmp_path: Path, fault_matrix, redis_url):
    slow = SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=8, itl_s=0.02, seed=1)
    with Sim(slow) as ded, Sim(serverless_profile()) as sl:
        config = tmp_path / "t.yaml"
        config.write_text(
            config_text(
                ded.base_url,
                sl.base_url,
                extra=f"state: {{redis_url: '{redis_url}'}}\nlimits: {{drain_s: 20}}\n",
            )
        )
        with CliProcess("serve", "--config", str(config), "--port", "0") as gw:
            started = threading.Barrier(CONCURRENCY + 1)

            def send(i: int) -> str:
                if i < CONCURRENCY:
                    started.wait(timeout=10)
                return one_request(gw.url, stream=True, max_tokens=50)  # ~1 s each

            results: list[MatrixRow] = []
            runner = threading.Thread(
                target=lambda: results.append(
                    burst("gateway SIGTERMed mid-burst", CONCURRENCY, CONCURRENCY, send)
                )
            )
            runner.start()
            started.wait(timeout=10)
            wait_until(lambda: ded.stats()["running"] == CONCURRENCY, timeout=10)
            code = gw.stop(signal.SIGTERM)  # returns once the drained process has exited
            runner.join(timeout=30)
        leases = redis.Redis.from_url(redis_url).zcard("tidegate:slots:{ded}")
    (row,) = results
    row.leases_after = leases
    fault_matrix.append(row)
    assert row.lost == 0, row.lost_detail
    assert row.succeeded == CONCURRENCY  # every in-flight stream finished
    assert code in (0, -signal.SIGTERM)  # uvicorn re-raises SIGTERM once it has drained
    assert leases == 0


def test_a_drain_that_runs_out_ends_each_stream_with_an_error_event(tmp_path: Path):
    """Streams longer than the drain are cut when it ends, each with an `event: error` first:
    a client never sees a stream simply stop."""
    slow = SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=8, itl_s=0.05, seed=1)
    with Sim(slow) as ded, Sim(serverless_profile()) as sl:
        config = tmp_path / "t.yaml"
        config.write_text(config_text(ded.base_url, sl.base_url, extra="limits: {drain_s: 1}\n"))
        with CliProcess("serve", "--config", str(config), "--port", "0") as gw:
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "max_tokens": 400,
            }
            with httpx.stream("POST", gw.url + "/chat/completions", json=body, timeout=30) as answer:
                chunks = answer.iter_bytes()
                received = next(chunks)  # the stream is under way (~20 s long)
                stopper = threading.Thread(target=gw.stop, args=(signal.SIGTERM,))
                stopper.start()
                with contextlib.suppress(httpx.HTTPError):
                    for chunk in chunks:
                        received += chunk
                stopper.join(30)
    events = [e for e in received.split(b"\n\n") if e.strip()]
    assert events[-1].startswith(b"event: error\ndata: ")
    assert b'"code":"server_stopping"' in events[-1]
    assert b"[DONE]" not in received
