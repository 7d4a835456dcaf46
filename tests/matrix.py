"""The fault matrix's bookkeeping: bounded bursts through a gateway, each request classified,
and a summary table printed at the end of the test run (see conftest.pytest_terminal_summary).

A request *succeeded* when it got a 2xx and its whole answer; a *clean error* is an
OpenAI-style error (an error status with an `{"error": {...}}` body, or a stream ended by an
SSE error event) within the client's timeout; *client gone* is a request whose client left on
purpose; anything else (a hang past the timeout, a reset without an error, a malformed body)
is *lost*. After each case, *leases* is the dedicated slots still held once the case has
settled (it must be 0), and *RSS +MB* the growth of the gateway process's resident memory
across the case, for the cases that try to grow it (measured on a separate process).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import openai
import pytest

ROWS: pytest.StashKey[list[MatrixRow]] = pytest.StashKey()


@dataclass
class MatrixRow:
    case: str
    requests: int = 0
    succeeded: int = 0
    clean_errors: int = 0
    client_gone: int = 0
    lost: int = 0
    lost_detail: list[str] = field(default_factory=list)
    leases_after: int | None = None
    rss_growth_mb: float | None = None


def one_request(
    url: str,
    *,
    stream: bool,
    api_key: str = "x",
    timeout: float = 20.0,
    max_tokens: int = 8,
    model: str = "m",
) -> str:
    """One chat request: 'ok', 'error' (clean) or 'lost: ...'."""
    client = openai.OpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=timeout)
    messages = [{"role": "user", "content": "hi"}]
    try:
        if stream:
            text = ""
            for chunk in client.chat.completions.create(
                model=model, messages=messages, max_tokens=max_tokens, stream=True
            ):
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
        else:
            reply = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens)
            text = reply.choices[0].message.content or ""
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return (
            "error"
            if "message" in body or "error" in body
            else f"lost: {exc.status_code} without an error body"
        )
    except openai.APIError as exc:  # the SDK raises this for an SSE error event
        if isinstance(exc, openai.APIConnectionError):
            return f"lost: {type(exc).__name__}: {exc}"
        return "error"
    return "ok" if text else "lost: empty answer"


def settled_value(read: Callable[[], int], timeout: float = 10.0) -> int:
    """`read()` once it is 0, or its last value when `timeout` passes first (for the table and
    the assertion that follows: a leak shows as a number, not only as a timeout)."""
    deadline = time.monotonic() + timeout
    while (value := read()) != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


def burst(case: str, count: int, concurrency: int, send: Callable[[int], str]) -> MatrixRow:
    """Run `send(i)` for i in range(count), `concurrency` at a time (threads); classify."""
    row = MatrixRow(case)
    lock = threading.Lock()
    next_index = iter(range(count))

    def worker() -> None:
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            try:
                result = send(i)
            except Exception as exc:  # counted as lost below, with its description
                result = f"lost: {type(exc).__name__}: {exc}"
            with lock:
                row.requests += 1
                if result == "ok":
                    row.succeeded += 1
                elif result == "error":
                    row.clean_errors += 1
                elif result == "gone":
                    row.client_gone += 1
                else:
                    row.lost += 1
                    row.lost_detail.append(result)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return row


def table(rows: list[MatrixRow]) -> str:
    header = (
        f"{'case':46} {'requests':>8} {'succeeded':>9} {'clean errors':>12} {'client gone':>11} {'lost':>5}"
        f" {'leases':>6} {'RSS +MB':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        leases = "-" if r.leases_after is None else str(r.leases_after)
        rss = "-" if r.rss_growth_mb is None else f"{r.rss_growth_mb:.1f}"
        lines.append(
            f"{r.case:46} {r.requests:>8} {r.succeeded:>9} {r.clean_errors:>12} {r.client_gone:>11} {r.lost:>5}"
            f" {leases:>6} {rss:>7}"
        )
    return "\n".join(lines)
