"""Real servers on loopback for the tests: uvicorn in a thread, or a CLI subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import redis
import uvicorn
from starlette.types import ASGIApp

from router.cli.serving import Served, bind, server_config
from router.config import LimitsConfig
from tidegate.sim.app import create_sim_app
from tidegate.sim.profile import SimProfile

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout: float = 10.0, interval: float = 0.01) -> T:
    """Poll `check` until it answers something true, and return that; fail the test after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (answer := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)
    return answer


class ThreadServer:
    """An ASGI app served by uvicorn (httptools) in a thread with its own event loop."""

    def __init__(self, app: ASGIApp, limits: LimitsConfig | None = None) -> None:
        """Served as `tidegate serve` serves (router/cli/serving.py), with the app's own limits
        (or `limits`), on the asyncio loop."""
        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = getattr(getattr(app, "state", None), "config", None)
        if limits is None:
            limits = config.limits if config is not None else LimitsConfig()
        proxies = config.server.forwarded_allow_ips if config is not None else ()
        served = Served(app, self.sock, limits=limits, forwarded_allow_ips=proxies)
        self.server = uvicorn.Server(server_config(served, loop="asyncio"))
        self.server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        wait_until(lambda: self.server.started)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()


class Sim(ThreadServer):
    """A simulator in a thread, with helpers for its control endpoints."""

    def __init__(self, profile: SimProfile) -> None:
        self.app = create_sim_app(profile)
        super().__init__(self.app)
        self.base_url = self.url + "/v1"

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = httpx.get(self.url + "/sim/stats").json()
        return result

    def configure(self, **changes: Any) -> None:
        httpx.put(self.url + "/sim/config", json=changes).raise_for_status()


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """`tidegate ARGS...` to completion (bounded), its output captured; `env` adds variables."""
    return subprocess.run(
        [sys.executable, "-m", "tidegate", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **(env or {})},
    )


class CliProcess:
    """`tidegate ...` as a real OS process; waits for the line announcing its URL."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = [sys.executable, "-m", "tidegate", *args]
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.output: list[str] = []

    def __enter__(self) -> CliProcess:
        self.proc = subprocess.Popen(
            self.args, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 30
        for line in self.proc.stdout:
            self.output.append(line)
            found = re.search(r"(http://[\d.]+:\d+/v1)", line)
            if found:
                self.url = found.group(1)
                break
            if time.monotonic() > deadline:
                break
        if not self.url:
            self.stop()
            raise AssertionError("process did not announce a URL:\n" + "".join(self.output))
        threading.Thread(target=self._drain, daemon=True).start()
        return self

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")


def free_port_iter() -> Iterator[int]:
    while True:
        sock = bind("127.0.0.1", 0)
        port = int(sock.getsockname()[1])
        sock.close()
        yield port


@functools.cache
def _redis_major() -> int:
    """The installed redis-server's major version (asked once per process)."""
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"v=(\d+)", version)
    return int(found.group(1)) if found else 0


class RedisServer:
    """A real `redis-server` on a free loopback port, no persistence; ended by its PID.

    A free port can be taken by another test worker between choosing it and binding it, so a
    server that exits at start is started again on fresh ports (three tries)."""

    def __init__(self, *extra: str, password: str | None = None, cluster_bus: bool = False) -> None:
        """`extra`: more redis-server arguments; `password`: its `requirepass`; `cluster_bus`: a
        cluster node, with its bus on a free port of its own (not port + 10000)."""
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None
        self._extra = (*extra, *(("--requirepass", password) if password else ()))
        self._cluster_bus = cluster_bus
        self._pick_ports()

    def _pick_ports(self) -> None:
        ports = free_port_iter()
        self.port = next(ports)
        self.bus_port = next(p for p in ports if p != self.port)
        secret = f":{self.password}@" if self.password else ""
        self.url = f"redis://{secret}127.0.0.1:{self.port}/0"

    def _command(self) -> list[str]:
        bus = ["--cluster-port", str(self.bus_port)] if self._cluster_bus and _redis_major() >= 7 else []
        debug = ["--enable-debug-command", "local"] if _redis_major() >= 7 else []
        return [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--protected-mode", "no", *debug, *bus, *self._extra,
        ]  # fmt: skip

    def start(self) -> RedisServer:
        for attempt in range(3):
            if attempt:
                self._pick_ports()
            self.proc = subprocess.Popen(self._command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_until(self._answers_or_exited, timeout=15)
            if self.proc.poll() is None:
                return self
        raise AssertionError(f"redis-server exited at start three times, last on port {self.port}")

    def _answers_or_exited(self) -> bool:
        return self.proc is not None and (self.proc.poll() is not None or self._answers())

    def _answers(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, password=self.password, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=15)

    def flush(self) -> None:
        redis.Redis(port=self.port, password=self.password).flushall()


class RedisClusterServers:
    """A real Redis Cluster of three masters (no replicas) on free loopback ports, made with
    `redis-cli --cluster create`; its node files live in `workdir`. Ended by the nodes' PIDs."""

    def __init__(self, workdir: str) -> None:
        self.nodes: list[RedisServer] = []
        for i in range(3):
            node_file = os.path.join(workdir, f"nodes-{i}.conf")
            extra = ["--cluster-enabled", "yes", "--cluster-config-file", node_file, "--dir", workdir]
            self.nodes.append(RedisServer(*extra, cluster_bus=True))

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def start(self) -> RedisClusterServers:
        try:
            for node in self.nodes:
                node.start()
            addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
            subprocess.run(
                ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=30,
            )
            wait_until(self._ready, timeout=15, interval=0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        """Every node sees all 16384 slots served."""
        for node in self.nodes:
            info = redis.Redis(port=node.port, socket_timeout=0.5).cluster("info")
            if info.get("cluster_state") != "ok":
                return False
        return True

    def node_of(self, key: str) -> int:
        """The port of the master that holds `key`."""
        slot = redis.Redis(port=self.nodes[0].port).cluster("keyslot", key)
        for start, end, (_host, port, *_rest), *_replicas in redis.Redis(
            port=self.nodes[0].port
        ).execute_command("CLUSTER SLOTS"):  # type: ignore[no-untyped-call]
            if start <= slot <= end:
                return int(port)
        raise AssertionError(f"no node serves slot {slot}")

    def flush(self) -> None:
        for node in self.nodes:
            redis.Redis(port=node.port).flushall()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class RawUpstream:
    """A TCP server on loopback that answers every request with `response` (raw bytes),
    whatever HTTP it is: for upstreams that break the protocol."""

    def __init__(
        self, response: bytes, *, send_timeout_s: float = 2.0, read_body: bool = False, hold_s: float = 0.0
    ) -> None:
        """`read_body`: read each request's whole body (by its content-length) before
        answering, so a large one is taken in full; `hold_s`: then wait this long."""
        self.response = response
        self.send_timeout_s = send_timeout_s
        self.read_body = read_body
        self.hold_s = hold_s
        self.received: list[bytes] = []  # the first read of each request, as it came
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(self.send_timeout_s)
            with contextlib.suppress(OSError):
                first = conn.recv(65536)
                self.received.append(first)
                if self.read_body:
                    _read_body(conn, first)
                if self.hold_s:
                    self._stop.wait(self.hold_s)
                conn.sendall(self.response)

    def __enter__(self) -> RawUpstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def _read_body(conn: socket.socket, first: bytes) -> None:
    """Read the rest of one request whose first bytes were `first` (its head at least)."""
    head, _, body = first.partition(b"\r\n\r\n")
    found = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    left = (int(found.group(1)) if found else 0) - len(body)
    while left > 0 and (chunk := conn.recv(min(left, 1 << 20))):
        left -= len(chunk)


def http_response(status: str, headers: str = "", body: bytes = b"") -> bytes:
    """A whole HTTP/1.1 response, raw, for RawUpstream."""
    return (
        f"HTTP/1.1 {status}\r\n{headers}content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body
    )


# Upstream answers that break HTTP or refuse the gateway itself, for RawUpstream.
BROKEN_UPSTREAMS = {
    "malformed status line": b"HTTP/1.1 abc\r\n\r\n",
    "header over 8 KiB": http_response("200 OK", "x-big: " + "a" * 10_000 + "\r\n", b"{}"),
    "401 with a key hint": http_response(
        "401 Unauthorized",
        "content-type: application/json\r\n",
        b'{"error": {"message": "Incorrect API key provided: sk-prov...wxyz", "type": "invalid_request_error"}}',
    ),
    "403": http_response("403 Forbidden", "", b"nope"),
    "404 (wrong base_url)": http_response("404 Not Found", "", b"no such path"),
    "302 redirect": http_response("302 Found", "location: http://elsewhere.example/\r\n"),
    "closed without answering": b"",
    "truncated body": b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\ncontent-type: application/json\r\n\r\n{",
}
