"""The fault matrix's bookkeeping: bounded bursts through a gateway, each request classified,
and a summary table printed at the end of the test run (see conftest.pytest_terminal_summary).

A request *succeeded* when it got a 2xx and its whole answer; a *clean error* is an
OpenAI-style error (an error status with an `{"error": {...}}` body, or a stream ended by an
SSE error event) within the client's timeout; *client gone* is a request whose client left on
purpose; anything else (a hang past the timeout, a reset without an error, a malformed body)
is *lost*.
"""

from __future__ import annotations

import threading
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

    def add(self, other: MatrixRow) -> None:
        self.requests += other.requests
        self.succeeded += other.succeeded
        self.clean_errors += other.clean_errors
        self.client_gone += other.client_gone
        self.lost += other.lost
        self.lost_detail += other.lost_detail


def one_request(
    url: str, *, stream: bool, api_key: str = "x", timeout: float = 20.0, max_tokens: int = 8
) -> str:
    """One chat request: 'ok', 'error' (clean) or 'lost: ...'."""
    client = openai.OpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=timeout)
    messages = [{"role": "user", "content": "hi"}]
    try:
        if stream:
            text = ""
            for chunk in client.chat.completions.create(
                model="m", messages=messages, max_tokens=max_tokens, stream=True
            ):
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
        else:
            reply = client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens)
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
        f"{'case':42} {'requests':>8} {'succeeded':>9} {'clean errors':>12} {'client gone':>11} {'lost':>5}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.case:42} {r.requests:>8} {r.succeeded:>9} {r.clean_errors:>12} {r.client_gone:>11} {r.lost:>5}"
        )
    return "\n".join(lines)
