"""The fault matrix, hostile half: one `tidegate serve` process (so its memory can be measured
from outside) on a real Redis, in front of real simulators and raw upstreams that break the
protocol, hit by clients that send what no SDK would. Each case is a bounded burst; after it
the dedicated leases in Redis must be back to 0, nothing may be lost, and the cases that try
to grow the process must leave its resident memory near where it was."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import redis

from tests.conftest import serverless_profile
from tests.matrix import MatrixRow, burst, one_request, settled_value
from tests.servers import BROKEN_UPSTREAMS, CliProcess, RawUpstream, RedisServer, Sim, http_response
from tidegate.sim.profile import Kind, SimProfile

COUNT, CONCURRENCY = 16, 4
# What a resource case may leave resident: the worst the limits allow here is 24 requests in
# flight x a 4 MiB body (96 MiB) plus the interpreter's own growth. Unbounded, these cases
# grew the process by 80-760 MB (the reproductions). Run again, a case must reuse
# what the first run left (RSS_REPEAT_MB): a leak grows on every run.
RSS_BOUND_MB = 128
RSS_REPEAT_MB = 16
BODY_BUDGET_MB = 64
LIMITS = (
    "{max_in_flight: 24, header_timeout_s: 1.5, body_timeout_s: 1.5, client_write_timeout_s: 0.5,"
    " max_header_bytes: 16384, max_response_bytes: 4194304, max_event_bytes: 1048576,"
    f" max_body_bytes_in_flight: {BODY_BUDGET_MB * 1024 * 1024}, discard_timeout_s: 1}}"
)
KEY = "x"  # what tests.matrix.one_request sends
TIMEOUTS = "timeouts: {connect_s: 1, ttft_s: 2, idle_s: 2, total_s: 20}"
MiB = 1024 * 1024

# models whose dedicated endpoint is a raw upstream that breaks HTTP; serverless serves them
RAW_UPSTREAMS = {
    "malformed-status": BROKEN_UPSTREAMS["malformed status line"],
    "header-over-8k": BROKEN_UPSTREAMS["header over 8 KiB"],
    "upstream-401": BROKEN_UPSTREAMS["401 with a key hint"],
    "body-64mib": http_response("200 OK", "content-type: application/json\r\n", b" " * (64 * MiB)),
    "event-16mib": b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: " + b"a" * (16 * MiB),
}

# a valid chat stream of 24 MiB, sent as fast as the gateway reads it: more than any socket buffers
_EVENT = orjson.dumps(
    {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": "a" * 4096}}],
    }
)
LONG_STREAM = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + (
    b"data: " + _EVENT + b"\n\n"
) * (24 * MiB // len(_EVENT))


class Gateway:
    """The process under test and what the matrix reads from it."""

    def __init__(self, process: CliProcess, redis_url: str) -> None:
        self.process = process
        self.url = process.url
        self.root = process.root
        self._redis = redis.Redis.from_url(redis_url)

    def leases(self) -> int:
        return sum(int(self._redis.zcard(key)) for key in self._redis.scan_iter("tidegate:slots:*"))

    def rss_mb(self) -> float:
        assert self.process.proc is not None
        status = Path(f"/proc/{self.process.proc.pid}/status").read_text()
        kb = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
        return int(kb) / 1024


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[Gateway]:
    redis_server.flush()
    ded = SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=64, itl_s=0.002, seed=1)
    with contextlib.ExitStack() as stack:
        ded_sim = stack.enter_context(Sim(ded))
        long_stream = stack.enter_context(RawUpstream(LONG_STREAM, send_timeout_s=30))
        sl_sim = stack.enter_context(Sim(serverless_profile()))
        raws = {name: stack.enter_context(RawUpstream(answer)) for name, answer in RAW_UPSTREAMS.items()}
        lines = [
            f"state: {{redis_url: '{redis_server.url}', lease_ttl_s: 3}}",
            f"auth: {{api_keys: [{KEY}], admin_key: admin-key-of-the-matrix}}",
            f"limits: {LIMITS}",
            "models:",
        ]
        dedicated = {
            "m": ded_sim.base_url,
            "long-stream": long_stream.url,
            **{name: raw.url for name, raw in raws.items()},
        }
        for model, url in dedicated.items():
            lines += [
                f"  {model}:",
                "    retry: {attempts: 3, backoff_ms: 1}",
                f"    dedicated: [{{name: ded-{model}, gpu_hour_usd: 0, base_url: '{url}', model: d, max_concurrency: 4, {TIMEOUTS}}}]",
                f"    serverless: [{{name: sl-{model}, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl_sim.base_url}', model: s, {TIMEOUTS}}}]",
            ]
        config = tmp_path_factory.mktemp("limits") / "tidegate.yaml"
        config.write_text("\n".join(lines) + "\n")
        # glibc raises its mmap threshold after freeing a large block, so whether a second run
        # of 4 MiB bodies lands in fresh heap (RSS up) or reused heap is the allocator's mood;
        # a fixed threshold keeps the repeat check about leaks, which grow either way
        process = stack.enter_context(
            CliProcess(
                "serve", "--config", str(config), "--port", "0", env={"MALLOC_MMAP_THRESHOLD_": "131072"}
            )
        )
        yield Gateway(process, redis_server.url)


def run_case(
    gateway: Gateway,
    fault_matrix: list[MatrixRow],
    case: str,
    send: Callable[[int], str],
    *,
    concurrency: int = CONCURRENCY,
    measure_rss: bool = False,
) -> MatrixRow:
    """One burst, its row in the matrix, and its checks. A resource case runs its burst a
    second time: the first may grow the heap up to what the limits allow (the allocator keeps
    freed memory for reuse), the second must reuse it, not grow again."""
    count = COUNT if concurrency <= COUNT else concurrency
    before = gateway.rss_mb()
    row = burst(case, count, concurrency, send)
    row.leases_after = settled_value(gateway.leases)
    again_mb = 0.0
    if measure_rss:
        row.rss_growth_mb = max(0.0, gateway.rss_mb() - before)
        first = gateway.rss_mb()
        repeat = burst(case, count, concurrency, send)
        again_mb = gateway.rss_mb() - first
        assert repeat.lost == 0, repeat.lost_detail
    fault_matrix.append(row)
    assert row.lost == 0, row.lost_detail
    assert row.leases_after == 0
    if measure_rss:
        assert row.rss_growth_mb is not None and row.rss_growth_mb < RSS_BOUND_MB
        assert again_mb < RSS_REPEAT_MB, f"the same case again grew the process by {again_mb:.1f} MB"
    return row


def clean_4xx(answer: httpx.Response) -> str:
    """'error' for an OpenAI-style 4xx; anything else (a 5xx included) is lost."""
    try:
        body = answer.json()
    except ValueError:
        body = None
    if 400 <= answer.status_code < 500 and isinstance(body, dict) and "error" in body:
        return "error"
    return f"lost: {answer.status_code} {answer.text[:200]}"


def post_raw_body(gateway: Gateway, body: bytes) -> str:
    answer = httpx.post(
        gateway.url + "/chat/completions",
        content=body,
        headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"},
        timeout=20,
    )
    return clean_4xx(answer)


def nested(depth: int) -> bytes:
    return b'{"model": "m", "messages": [], "meta": ' + b"[" * depth + b"]" * depth + b"}"


HOSTILE_BODIES: dict[str, Callable[[int], bytes]] = {
    "client n / best_of = 5000": lambda i: orjson.dumps(
        {"model": "m", "messages": [], "n": 5000, "best_of": 5000, "stream": i % 2 == 0}
    ),
    "client huge and odd numbers": lambda i: [
        b'{"model": "m", "messages": [], "max_tokens": 1e400}',
        b'{"model": "m", "messages": [], "max_tokens": 36893488147419103232}',
        b'{"model": "m", "messages": [], "temperature": NaN}',
        b'{"model": "m", "messages": [], "max_tokens": -0.0, "n": true}',
    ][i % 4],
}


@pytest.mark.parametrize("case", sorted(HOSTILE_BODIES))
def test_hostile_client_bodies_are_400s_and_take_no_slot(gateway, fault_matrix, case):
    row = run_case(gateway, fault_matrix, case, lambda i: post_raw_body(gateway, HOSTILE_BODIES[case](i)))
    assert row.clean_errors == COUNT


def test_deeply_nested_client_bodies_are_forwarded_as_written_or_refused_cleanly(gateway, fault_matrix):
    """The gateway reads only a body's top level, so nesting in a field it does not read is the
    upstream's to judge (forwarded byte for byte); past what its scanner reads (~1000 levels)
    it is a clean 400. Either way no 5xx and no slot held."""

    def send(i: int) -> str:
        answer = httpx.post(
            gateway.url + "/chat/completions",
            content=nested(300 + 50 * i),
            headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"},
            timeout=20,
        )
        return "ok" if answer.status_code == 200 else clean_4xx(answer)

    row = run_case(gateway, fault_matrix, "client body nested 300 to 1050 deep", send)
    assert row.succeeded + row.clean_errors == COUNT
    assert row.clean_errors >= 1 and row.succeeded >= 1  # both sides of the scanner's depth


@pytest.mark.parametrize("model", sorted(RAW_UPSTREAMS))
def test_a_protocol_breaking_dedicated_upstream_fails_over(gateway, fault_matrix, model):
    def send(i: int) -> str:
        return one_request(gateway.url, stream=i % 2 == 0, model=model)

    big = model.startswith(("body", "event"))
    row = run_case(gateway, fault_matrix, f"dedicated upstream: {model}", send, measure_rss=big)
    assert row.succeeded == COUNT  # every one failed over to serverless


def raw_exchange(
    gateway: Gateway, head: bytes, *, then: Callable[[socket.socket], None] | None = None
) -> bytes:
    """Send `head` on a fresh connection (as much of it as the gateway takes), run `then`, and
    read the answer until the gateway closes."""
    host, port = gateway.root.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        with contextlib.suppress(OSError):  # the gateway may close before it has all of it
            for start in range(0, len(head), 65536):
                conn.sendall(head[start : start + 65536])
            if then is not None:
                then(conn)
        out = b""
        with contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                out += chunk
    return out


def refused_with(*statuses: bytes) -> Callable[[bytes], str]:
    """'error' for an answer with one of `statuses` and an OpenAI-style error body."""

    def verdict(answer: bytes) -> str:
        status_ok = any(answer.startswith(b"HTTP/1.1 " + status) for status in statuses)
        return "error" if status_ok and b'{"error":' in answer else f"lost: {answer[:300]!r}"

    return verdict


def stall(conn: socket.socket) -> None:
    # the subject of the case: a client that stops sending, well past the header and body
    # timeouts (1.5 s: above what a starved client thread of this test process may take
    # between its connect and its headers, which the timeout also counts)
    threading.Event().wait(4.0)


CHAT_HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    b"authorization: Bearer " + KEY.encode() + b"\r\n"
)


@pytest.mark.parametrize(
    ("case", "head", "then", "expect", "concurrency"),
    [
        ("client headers of 8 MiB", CHAT_HEAD + b"x-pad: " + b"a" * (8 * MiB), None, (b"431",), CONCURRENCY),
        ("client headers stall half-way", CHAT_HEAD, stall, (b"408",), COUNT),
        (
            "client 4 MiB bodies stall at the last byte x40",
            CHAT_HEAD + b"content-length: %d\r\n\r\n" % (4 * MiB) + b"{" + b" " * (4 * MiB - 2),
            stall,
            (b"408", b"503", b"429"),  # 503: past max_in_flight; 429: past the key's share of the budget
            40,
        ),
    ],
)
def test_clients_that_try_to_grow_the_process_are_refused(
    gateway, fault_matrix, case, head, then, expect, concurrency
):
    verdict = refused_with(*expect)
    row = run_case(
        gateway,
        fault_matrix,
        case,
        lambda i: verdict(raw_exchange(gateway, head, then=then)),
        concurrency=concurrency,
        measure_rss=True,
    )
    assert row.clean_errors == row.requests


def test_a_client_that_stops_reading_a_stream_is_cut_and_its_slot_freed(gateway, fault_matrix):
    body = orjson.dumps({"model": "long-stream", "messages": [], "stream": True})
    head = CHAT_HEAD + b"content-length: %d\r\n\r\n" % len(body) + body

    def never_read(i: int) -> str:
        host, port = gateway.root.removeprefix("http://").split(":")
        received, relayed = b"", 0
        with socket.socket() as conn:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            conn.settimeout(30)
            conn.connect((host, int(port)))
            conn.sendall(head)
            # The subject: once the stream has begun (its first bytes are here), not reading for
            # six times the write timeout. Timed from the stream's start, not the client's: on a
            # loaded machine the answer may begin a second or more after the request was sent.
            readable, _, _ = select.select([conn], [], [], 30)
            if not readable:
                return "lost: the stream never began"
            threading.Event().wait(3.0)
            with contextlib.suppress(OSError):
                while not received.endswith(b"\r\n0\r\n\r\n") and (chunk := conn.recv(1 << 20)):
                    received = received[-64:] + chunk
                    relayed += len(chunk)
        # cut by the gateway: far less than the upstream's 24 MiB reached the client
        return "gone" if relayed < 16 * MiB else f"lost: the stream was never cut ({relayed} bytes)"

    row = run_case(
        gateway, fault_matrix, "client stops reading a long stream", never_read, concurrency=8, measure_rss=True
    )
    assert row.client_gone == COUNT


def test_requests_past_max_in_flight_get_a_clean_503(gateway, fault_matrix):
    def send(i: int) -> str:
        return one_request(gateway.url, stream=True, max_tokens=60)

    row = run_case(gateway, fault_matrix, "40 at once, max_in_flight 24", send, concurrency=40)
    assert row.succeeded + row.clean_errors == 40


def test_a_redis_stall_mid_burst_leaves_no_ghost_lease(gateway, fault_matrix, redis_server):
    staller = redis.Redis(port=redis_server.port, socket_timeout=10)
    stalled = threading.Event()

    def send(i: int) -> str:
        if i == CONCURRENCY and not stalled.is_set():
            stalled.set()
            threading.Thread(target=staller.execute_command, args=("DEBUG", "SLEEP", "1.5")).start()
        return one_request(gateway.url, stream=i % 2 == 0, max_tokens=20)

    row = run_case(gateway, fault_matrix, "Redis stalls 1.5 s mid-burst", send)
    assert row.succeeded == COUNT


# --- clients without a key: nothing before auth is unbounded -------------------------------


def trickle(conn: socket.socket) -> None:
    """A slow body: a byte every 0.2 s for up to 8 s (past every body bound here), until the
    gateway stops taking bytes."""
    deadline = time.monotonic() + 8
    with contextlib.suppress(OSError):
        while time.monotonic() < deadline:
            conn.sendall(b" ")
            threading.Event().wait(0.2)


def closed_with(status: bytes, within_s: float) -> Callable[[Callable[[], bytes]], str]:
    """'error' (a clean refusal) when the answer has `status` and the gateway closed the
    connection within `within_s`; anything else is lost (held open, or the wrong answer)."""

    def verdict(exchange: Callable[[], bytes]) -> str:
        started = time.monotonic()
        answer = exchange()
        took = time.monotonic() - started
        if not answer.startswith(b"HTTP/1.1 " + status):
            return f"lost: {answer[:200]!r}"
        return "error" if took < within_s else f"lost: the connection was held {took:.1f} s"

    return verdict


def no_key_head(method: bytes, path: bytes, length: int) -> bytes:
    return b"%s %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % (method, path, length)


@pytest.mark.parametrize(
    ("case", "head", "status"),
    [
        ("no key, slow body on /v1", no_key_head(b"POST", b"/v1/chat/completions", 100_000), b"401"),
        ("no key, slow body on /admin", no_key_head(b"PUT", b"/admin/models/m/canary", 60_000), b"401"),
        ("no key, slow body on a 404 path", no_key_head(b"POST", b"/nowhere", 60_000), b"404"),
        ("no key, slow body on /healthz", no_key_head(b"GET", b"/healthz", 60_000), b"200"),
    ],
)
def test_a_slow_body_without_a_key_is_answered_and_closed_on_every_path(
    gateway, fault_matrix, case, head, status
):
    verdict = closed_with(status, within_s=6)
    row = run_case(
        gateway, fault_matrix, case, lambda i: verdict(lambda: raw_exchange(gateway, head, then=trickle))
    )
    assert row.clean_errors == row.requests


def test_stalled_4_mib_bodies_without_a_key_stay_within_the_body_budget(gateway, fault_matrix):
    head = no_key_head(b"POST", b"/v1/chat/completions", 4 * MiB) + b"{" + b" " * (4 * MiB - 2)
    # 401 (no key) or, for a head that arrives once the address's earlier bodies hold its share
    # of the body budget, 429: both clean refusals, which one depends on arrival order (a loaded
    # clean-clone run saw one 429 of 40)
    verdict = refused_with(b"401", b"429")
    row = run_case(
        gateway,
        fault_matrix,
        "no key, 4 MiB bodies stall at the last byte x40",
        lambda i: verdict(raw_exchange(gateway, head, then=stall)),
        concurrency=40,
        measure_rss=True,
    )
    assert row.clean_errors == row.requests
    assert row.rss_growth_mb is not None and row.rss_growth_mb <= BODY_BUDGET_MB


def test_a_300_mib_admin_body_without_a_key_is_refused_unread(gateway, fault_matrix):
    head = no_key_head(b"PUT", b"/admin/models/m/canary", 300 * MiB)
    host, port = gateway.root.removeprefix("http://").split(":")

    def send(i: int) -> str:
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(head)
            answer = conn.recv(65536)  # refused at the head: the answer comes before any body
            with contextlib.suppress(OSError):  # then the body: dropped, up to the discard bound
                for _ in range(300):
                    conn.sendall(b" " * MiB)
        return refused_with(b"413")(answer)

    row = run_case(gateway, fault_matrix, "no key, 300 MiB admin body", send, concurrency=2, measure_rss=True)
    assert row.clean_errors == row.requests


def test_a_redis_pause_mid_burst_leaves_no_ghost_lease(gateway, fault_matrix, redis_server):
    pauser = redis.Redis(port=redis_server.port, socket_timeout=10)
    paused = threading.Event()

    def send(i: int) -> str:
        if i == CONCURRENCY and not paused.is_set():
            paused.set()
            pauser.execute_command("CLIENT", "PAUSE", 2500, "ALL")
        return one_request(gateway.url, stream=i % 2 == 0, max_tokens=20)

    row = run_case(gateway, fault_matrix, "Redis CLIENT PAUSE 2.5 s mid-burst", send)
    assert row.succeeded == COUNT
