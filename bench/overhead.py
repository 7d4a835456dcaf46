"""Gateway overhead: the same load sent straight to an upstream and through tidegate.

The upstream is nginx (Debian's `nginx-light`) answering a fixed chat completion and a fixed
20-chunk SSE stream, so the gateway is the bottleneck. The gateway runs as `tidegate serve`
(one uvicorn worker) pinned to CPU 0; this load generator (aiohttp) is pinned to CPU 1.
Gateway CPU per request comes from the gateway process's own utime+stime (/proc).

    python -m bench.overhead [--seconds 5] [--concurrency 1 16 64]

Prints one row per (mode, concurrency, path): requests/s, latency p50/p99, TTFT p50/p99
(first body byte) and gateway CPU ms per request, with the gateway's added p50 TTFT.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

CHAT = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hello " * 16}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 16, "total_tokens": 28},
    }
).decode()


def sse_body() -> str:
    events = []
    for i in range(20):
        delta = {"role": "assistant", "content": ""} if i == 0 else {"content": f"tok{i} "}
        chunk = {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "bench",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }
        events.append("data: " + orjson.dumps(chunk).decode() + "\\n\\n")
    return "".join(events) + "data: [DONE]\\n\\n"


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir};
  proxy_temp_path {dir};
  fastcgi_temp_path {dir};
  uwsgi_temp_path {dir};
  scgi_temp_path {dir};
  keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{port};
    location /plain/v1/chat/completions {{ default_type application/json; return 200 '{chat}'; }}
    location /stream/v1/chat/completions {{ default_type text/event-stream; return 200 '{sse}'; }}
  }}
}}
"""

GATEWAY_CONF = """
listen: {{host: 127.0.0.1, port: {port}}}
models:
  plain:
    dedicated: [{{name: nginx-plain, base_url: "http://127.0.0.1:{up}/plain/v1", model: bench, max_concurrency: 100000}}]
  stream:
    dedicated: [{{name: nginx-stream, base_url: "http://127.0.0.1:{up}/stream/v1", model: bench, max_concurrency: 100000}}]
"""


@dataclass
class Run:
    requests: int
    seconds: float
    latencies: list[float]
    ttfts: list[float]
    errors: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


async def load(url: str, model: str, stream: bool, concurrency: int, seconds: float) -> Run:
    body = orjson.dumps({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
    latencies: list[float] = []
    ttfts: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
                first = None
                async for _ in r.content.iter_any():
                    first = first or time.perf_counter()
                if r.status != 200:
                    errors += 1
            end = time.perf_counter()
            latencies.append(end - start)
            ttfts.append((first or end) - start)

    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return Run(len(latencies), time.perf_counter() - started, latencies, ttfts, errors)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{url} did not come up")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    args = parser.parse_args()
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        raise SystemExit("nginx not found: apt-get install -y nginx-light")
    if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > 1:  # type: ignore[operator]
        os.sched_setaffinity(0, {1})
    with tempfile.TemporaryDirectory() as tmp:
        up, gw = free_port(), free_port()
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=tmp, port=up, chat=CHAT, sse=sse_body()))
        (Path(tmp) / "tidegate.yaml").write_text(GATEWAY_CONF.format(port=gw, up=up))
        procs = [subprocess.Popen(["taskset", "-c", "1", nginx, "-c", str(conf)])]
        gateway = subprocess.Popen(
            [
                "taskset",
                "-c",
                "0",
                sys.executable,
                "-m",
                "router.cli",
                "--log-level",
                "info",
                "serve",
                "--config",
                str(Path(tmp) / "tidegate.yaml"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # access log on, as in production
        procs.append(gateway)
        try:
            wait_for(f"http://127.0.0.1:{up}/missing-is-fine")
            wait_for(f"http://127.0.0.1:{gw}/healthz")
            asyncio.run(report(up, gw, gateway.pid, args))
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=10)


async def report(up: int, gw: int, gw_pid: int, args: argparse.Namespace) -> None:
    print(
        f"{'path':7} {'conc':>4} {'mode':8} {'req/s':>8} {'lat p50':>8} {'lat p99':>8} "
        f"{'ttft p50':>8} {'ttft p99':>8} {'cpu ms/req':>10} {'added p50 ttft':>14}"
    )
    for stream in (False, True):
        path = "stream" if stream else "plain"
        for conc in args.concurrency:
            direct = await load(
                f"http://127.0.0.1:{up}/{path}/v1/chat/completions", "bench", stream, conc, args.seconds
            )
            before = cpu_seconds(gw_pid)
            via = await load(f"http://127.0.0.1:{gw}/v1/chat/completions", path, stream, conc, args.seconds)
            cpu_ms = (cpu_seconds(gw_pid) - before) * 1000 / max(1, via.requests)
            for mode, run in (("direct", direct), ("tidegate", via)):
                extra = (
                    f"{cpu_ms:>10.3f} {pct(via.ttfts, 0.5) - pct(direct.ttfts, 0.5):>12.3f}ms"
                    if mode == "tidegate"
                    else ""
                )
                print(
                    f"{path:7} {conc:>4} {mode:8} {run.requests / run.seconds:>8.0f} {pct(run.latencies, 0.5):>6.2f}ms "
                    f"{pct(run.latencies, 0.99):>6.2f}ms {pct(run.ttfts, 0.5):>6.2f}ms {pct(run.ttfts, 0.99):>6.2f}ms {extra}"
                    + (f"  errors={run.errors}" if run.errors else ""),
                    flush=True,
                )


if __name__ == "__main__":
    main()
