"""A pool found by DNS under load (issue 38): the official SDK -> two `tidegate serve`
replicas sharing a real redis-server -> `tidegate sim` replicas on 127.0.0.2-4 (one port,
as pods behind a headless Service), whose name a real DNS server on loopback resolves
(tests/nameserver.py). Replicas join and leave while requests stream: a new one gets traffic,
a removed one takes no new request while its streams in flight finish, every request is
answered once, and no lease is left behind."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
import redis

from tests.nameserver import Nameserver
from tests.servers import CliProcess, RedisServer, wait_until

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
SLOTS = 4


def common_port() -> int:
    """A port free on every host in HOSTS (pods behind one Service share theirs)."""
    for _ in range(50):
        probe = socket.socket()
        probe.bind((HOSTS[0], 0))
        port = probe.getsockname()[1]
        others = []
        try:
            for host in HOSTS[1:]:
                sock = socket.socket()
                others.append(sock)
                sock.bind((host, port))
            return int(port)
        except OSError:
            continue
        finally:
            for sock in (probe, *others):
                sock.close()
    raise AssertionError("no port free on every loopback host")


@dataclass
class Done:
    started: float
    ended: float
    route: str
    ok: bool


class Load:
    """`per_gateway` streaming clients on each gateway, one request after another, until stopped."""

    def __init__(self, gateways: list[CliProcess], per_gateway: int) -> None:
        self.done: list[Done] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._streaming: dict[str, int] = {}
        self._threads = [
            threading.Thread(target=self._run, args=(gw.url, n), daemon=True)
            for gw in gateways
            for n in range(per_gateway)
        ]

    def _run(self, url: str, n: int) -> None:
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        i = 0
        while not self._stop.is_set():
            i += 1
            started = time.monotonic()
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model="m",
                    messages=[{"role": "user", "content": f"client {url} {n} question {i}"}],
                    max_tokens=40,
                    stream=True,
                    extra_headers={"x-tidegate-session": f"{url}-{n}-{i}"},
                )
                route = raw.headers["x-tidegate-route"]
                with self._lock:
                    self._streaming[route] = self._streaming.get(route, 0) + 1
                try:
                    chunks = list(raw.parse())
                finally:
                    with self._lock:
                        self._streaming[route] -= 1
                self.done.append(Done(started, time.monotonic(), route, bool(chunks)))
            except openai.OpenAIError as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def streaming_on(self, route: str) -> float | None:
        """The time now if a stream on `route` has its headers and has not ended, else None: a
        stream counted here started before the time returned and ends after it."""
        with self._lock:
            return time.monotonic() if self._streaming.get(route, 0) > 0 else None

    def routes_since(self, at: float) -> list[str]:
        return [d.route for d in list(self.done) if d.started > at]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


@contextlib.contextmanager
def replicas(port: int) -> Iterator[list[CliProcess]]:
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(
                CliProcess(
                    "sim", "--profile", "dedicated", "--host", host, "--port", str(port), "--name", "d",
                    "--max-concurrency", str(SLOTS), "--time-scale", "5", "--answer-tokens-p50", "40",
                )
            )
            for host in HOSTS
        ]


def config(tmp_path, ns: Nameserver, port: int, redis_url: str) -> str:
    path = tmp_path / "tidegate.yaml"
    path.write_text(
        "auth: {allow_anonymous: true, admin_key: adm}\n"
        f"state: {{redis_url: '{redis_url}'}}\n"
        f"discovery: {{refresh_s: 0.2, forget_after_s: 1.5, nameservers: ['{ns.address}']}}\n"
        "models:\n  m:\n"
        "    routing: {max_queue_ms: 5000}\n"
        f"    dedicated: [{{name: vllm, model: d, gpu_hour_usd: 0, max_concurrency: {SLOTS}, max_replicas: 3,"
        f" replica_dns: 'http://vllm.test:{port}/v1'}}]\n"
    )
    return str(path)


def served(sim: CliProcess) -> int:
    return int(httpx.get(sim.root + "/sim/stats").json()["requests"])


@pytest.mark.timeout(150)
def test_replicas_join_and_leave_under_load_with_no_request_or_lease_lost(tmp_path):
    port = common_port()
    store = RedisServer().start()
    with contextlib.ExitStack() as stack:
        stack.callback(store.stop)
        ns = stack.enter_context(Nameserver())
        sims = stack.enter_context(replicas(port))
        ns.set("vllm.test", HOSTS[0])
        path = config(tmp_path, ns, port, store.url)
        with CliProcess("serve", "--config", path, "--port", "0") as a, CliProcess(
            "serve", "--config", path, "--port", "0"
        ) as b:
            with Load([a, b], per_gateway=2) as load:
                wait_until(lambda: len(load.done) >= 8, timeout=30)
                assert set(load.routes_since(0)) == {"vllm-0"}

                ns.set("vllm.test", HOSTS[0], HOSTS[1])  # a pod joins
                joined = time.monotonic()
                wait_until(lambda: "vllm-1" in load.routes_since(joined), timeout=15)
                assert served(sims[1]) > 0

                # the first pod leaves while a stream is in flight on it (on a loaded machine the
                # clients can all sit between requests at any one instant, so wait for one)
                left = wait_until(lambda: load.streaming_on("vllm-0"), timeout=15)
                ns.set("vllm.test", HOSTS[1])
                wait_until(lambda: len(load.routes_since(left + 2.0)) >= 12, timeout=30)
                after = served(sims[0])
                assert set(load.routes_since(left + 2.0)) == {"vllm-1"}

                ns.set("vllm.test", HOSTS[1], HOSTS[2])  # a third pod joins
                wait_until(lambda: served(sims[2]) > 0, timeout=15)
                assert served(sims[0]) == after  # the one that left took nothing since
                view = httpx.get(a.root + "/admin/models/m", headers={"authorization": "Bearer adm"}).json()
                urls = {d["base_url"] for d in view["dedicated"]}
                assert urls == {None, f"http://{HOSTS[1]}:{port}/v1", f"http://{HOSTS[2]}:{port}/v1"}
            assert load.errors == []
            # streams were in flight on the pod that left, and finished (answered, and ok)
            assert any(d.route == "vllm-0" and d.started < left < d.ended for d in load.done)
            total = len(load.done)
            assert all(d.ok for d in load.done)
            assert sum(served(s) for s in sims) == total  # every request answered once, none lost
            leases = redis.Redis(port=store.port)
            wait_until(
                lambda: all(leases.zcard(f"tidegate:slots:{{vllm-{i}}}") == 0 for i in range(3)), timeout=10
            )
