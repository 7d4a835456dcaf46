"""Connection-level bounds on request bodies (router/http/connection.py), from raw sockets against a
gateway served as `tidegate serve` serves it: every path, with or without a key, has a body
cap and a deadline before any handler or auth runs; a refused body is read and dropped for a
bounded time, never buffered; bodies in flight share one process-wide budget."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from router.app import create_app
from router.config import parse_config
from tests.servers import RawUpstream, ThreadServer, http_response

KEY, ADMIN = "client-key", "admin-key"
MiB = 1024 * 1024
ANSWER = orjson.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "u",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)
# the body deadline is long on purpose: a refused body must be dropped within the discard
# bound (0.5 s here), far sooner; the tests allow 10 s, so a slow machine cannot fail them
LIMITS = (
    "{body_timeout_s: 30, discard_timeout_s: 0.5, max_body_bytes: 1048576,"
    " max_body_bytes_in_flight: 4194304, max_control_body_bytes: 4096, max_share_per_caller: 1}"
)


def config_text(upstream: str, extra: str = "") -> str:
    return (
        f"auth: {{api_keys: [{KEY}], admin_key: {ADMIN}}}\n"
        f"limits: {LIMITS}\n{extra}"
        "models:\n  m:\n"
        f"    serverless: [{{name: s, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{upstream}', model: u}}]\n"
    )


@pytest.fixture(scope="module")
def upstream() -> Iterator[RawUpstream]:
    with RawUpstream(http_response("200 OK", "content-type: application/json\r\n", ANSWER)) as raw:
        yield raw


@pytest.fixture(scope="module")
def gateway(upstream: RawUpstream) -> Iterator[ThreadServer]:
    with ThreadServer(create_app(parse_config(config_text(upstream.url), {}))) as server:
        yield server


def head(method: str, path: str, length: int | None, *, key: str | None = None, extra: str = "") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: x", "content-type: application/json"]
    if length is not None:
        lines.append(f"content-length: {length}")
    if key is not None:
        lines.append(f"authorization: Bearer {key}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


class Exchange:
    """One raw connection: what came back, and when the gateway closed it."""

    def __init__(self, server: ThreadServer) -> None:
        self.conn = socket.create_connection(("127.0.0.1", server.port), timeout=15)
        self.answer = b""
        self.closed_after_s: float | None = None
        self._started = time.monotonic()

    def send(self, data: bytes) -> bool:
        """False once the gateway no longer takes bytes."""
        try:
            self.conn.sendall(data)
        except OSError:
            return False
        return True

    def trickle(self, byte: bytes, stop: threading.Event, every_s: float = 0.1) -> None:
        """A slow client: one byte every `every_s` until the gateway stops taking them."""
        while not stop.is_set() and self.send(byte):
            stop.wait(every_s)

    def read_to_close(self) -> bytes:
        with contextlib.suppress(OSError):
            while chunk := self.conn.recv(65536):
                self.answer += chunk
        self.closed_after_s = time.monotonic() - self._started
        self.conn.close()
        return self.answer

    def status(self) -> int:
        return int(self.answer.split(b" ", 2)[1]) if self.answer.startswith(b"HTTP/1.1 ") else 0


def slow_body(server: ThreadServer, head_bytes: bytes) -> Exchange:
    """Send `head_bytes`, then trickle the body in a thread while reading until the close."""
    exchange = Exchange(server)
    exchange.send(head_bytes)
    stop = threading.Event()
    trickler = threading.Thread(target=exchange.trickle, args=(b" ", stop), daemon=True)
    trickler.start()
    try:
        exchange.read_to_close()
    finally:
        stop.set()
        trickler.join(5)
    return exchange


@pytest.mark.parametrize(
    ("case", "head_bytes", "status"),
    [
        ("no key on /v1", head("POST", "/v1/chat/completions", 100_000), 401),
        ("no key on /admin", head("PUT", "/admin/models/m/canary", 4000), 401),
        ("a path that does not exist", head("POST", "/nowhere", 4000), 404),
        ("a health check with a body", head("GET", "/healthz", 4000), 200),
    ],
)
def test_a_slow_body_nobody_reads_is_answered_and_dropped_within_the_discard_bound(
    gateway, case, head_bytes, status
):
    exchange = slow_body(gateway, head_bytes)
    assert exchange.status() == status
    assert exchange.closed_after_s is not None and exchange.closed_after_s < 10  # body deadline: 30 s


def test_a_keyed_client_too_slow_with_its_body_gets_408_at_the_body_deadline(upstream):
    text = config_text(upstream.url).replace("body_timeout_s: 30", "body_timeout_s: 0.5")
    with ThreadServer(create_app(parse_config(text, {}))) as server:
        exchange = slow_body(server, head("POST", "/v1/chat/completions", 1000, key=KEY))
    assert exchange.status() == 408 and b'"code":"request_timeout"' in exchange.answer


def test_a_huge_admin_body_without_a_key_is_refused_before_a_byte_of_it_is_read(gateway):
    exchange = Exchange(gateway)
    exchange.send(head("PUT", "/admin/models/m/canary", 300 * MiB))
    answer = exchange.read_to_close()  # no body sent at all: the answer cannot have waited for it
    assert exchange.status() == 413 and b"limits.max_control_body_bytes" in answer


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/admin/models/m/canary", "/v1/feedback"])
def test_a_declared_body_over_its_paths_cap_is_413_and_a_client_that_sends_it_all_reads_it(gateway, path):
    size = 3 * MiB if path.startswith("/v1/chat") else 64 * 1024
    exchange = Exchange(gateway)
    sent = exchange.send(head("POST", path, size, key=KEY) + b" " * size)
    exchange.read_to_close()
    assert sent, "the gateway reset the connection while the client was still sending"
    assert exchange.status() == 413 and b'"code":"request_too_large"' in exchange.answer


def test_a_chunked_body_is_cut_at_its_cap(gateway):
    exchange = Exchange(gateway)
    chunk = b"%x\r\n" % (512 * 1024) + b" " * (512 * 1024) + b"\r\n"
    extra = "transfer-encoding: chunked\r\n"
    exchange.send(head("POST", "/v1/chat/completions", None, key=KEY, extra=extra) + chunk * 3 + b"0\r\n\r\n")
    exchange.read_to_close()
    assert exchange.status() == 413


def keyed_chat(server: ThreadServer) -> Exchange:
    body = orjson.dumps({"model": "m", "messages": []})
    exchange = Exchange(server)
    exchange.send(
        head("POST", "/v1/chat/completions", len(body), key=KEY, extra="connection: close\r\n") + body
    )
    exchange.read_to_close()
    return exchange


def test_bodies_in_flight_share_one_budget_and_a_head_that_does_not_fit_gets_503(gateway):
    holders = [Exchange(gateway) for _ in range(2)]
    for holder in holders:  # 2 x 1 MiB declared (held twice), stalled: the whole 4 MiB budget
        holder.send(head("POST", "/v1/chat/completions", MiB, key=KEY) + b"{")
    deadline = time.monotonic() + 10
    while (refused := keyed_chat(gateway)).status() == 200 and time.monotonic() < deadline:
        pass  # served before the holders' heads were read: ask again
    for holder in holders:
        holder.conn.close()
    assert refused.status() == 503 and b"limits.max_body_bytes_in_flight" in refused.answer
    assert b"retry-after: 1" in refused.answer.lower()
    deadline = time.monotonic() + 10  # the budget comes back when those requests end
    while (served := keyed_chat(gateway)).status() != 200 and time.monotonic() < deadline:
        pass
    assert served.status() == 200


def test_an_invalid_content_length_is_400(gateway):
    exchange = Exchange(gateway)
    exchange.send(head("POST", "/v1/chat/completions", None, key=KEY, extra="content-length: 12abc\r\n"))
    exchange.read_to_close()
    assert exchange.status() == 400


@pytest.mark.parametrize(
    ("trusted", "seen"), [("", b"127.0.0.1"), ("server: {forwarded_allow_ips: ['127.0.0.1']}\n", b"6.6.6.6")]
)
def test_x_forwarded_for_is_believed_only_from_the_configured_proxies(upstream, trusted, seen):
    with (
        RawUpstream(http_response("200 OK", "content-type: application/json\r\n", ANSWER)) as raw,
        ThreadServer(create_app(parse_config(config_text(raw.url, trusted), {}))) as server,
    ):
        answer = httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": "m", "messages": []},
            headers={"authorization": f"Bearer {KEY}", "x-forwarded-for": "6.6.6.6"},
        )
    assert answer.status_code == 200
    forwarded = [
        line for line in raw.received[0].split(b"\r\n") if line.lower().startswith(b"x-forwarded-for:")
    ]
    assert forwarded == [b"x-forwarded-for: " + seen]


def test_every_request_on_a_kept_alive_connection_gets_its_own_head_and_body_allowance(upstream):
    """The limits are per request: 300 requests on one connection, each head and body well
    within its limits but all of them together far over, are all served."""
    text = config_text(upstream.url).replace(
        "{body_timeout_s: 30,", "{max_header_bytes: 1024, body_timeout_s: 30,"
    )
    with (
        ThreadServer(create_app(parse_config(text, {}))) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        statuses = {
            client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "x" * 2000}]},
                headers={"authorization": f"Bearer {KEY}", "x-pad": "p" * 300},
            ).status_code
            for _ in range(300)
        }
    assert statuses == {200}
