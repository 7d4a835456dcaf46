"""The load side of the benchmarks: a closed-loop load of chat completions (aiohttp), the
latency and time-to-first-byte of each request, and the CPU time a process spent (/proc)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson


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
    """The `q` quantile of `values` (seconds), in milliseconds."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


async def load(url: str, model: str, stream: bool, concurrency: int, seconds: float) -> Run:
    """`concurrency` clients, each sending its next request as the last one ends, for `seconds`."""
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


def pooled(runs: list[Run]) -> Run:
    return Run(
        sum(r.requests for r in runs),
        sum(r.seconds for r in runs),
        [x for r in runs for x in r.latencies],
        [x for r in runs for x in r.ttfts],
        sum(r.errors for r in runs),
    )


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` and its live child processes (the workers of `--workers N`)."""
    total = 0.0
    for proc in [pid, *children(pid)]:
        try:
            fields = Path(f"/proc/{proc}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ValueError, IndexError):
            continue
        if ppid == pid:
            found.append(int(stat.parent.name))
    return found


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
