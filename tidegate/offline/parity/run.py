"""Send every case of a suite to every endpoint, `repeat` times, straight to the endpoint (its
base URL, model id and key; never through the gateway's routing), at most `concurrency` at once.

A transient failure (a 429 or 5xx, a dropped connection) is retried with backoff before it
counts: parity is about what an endpoint answers, an outage is the probe's and the breakers'
business. What still fails is an `error` outcome, which counts against the pass rate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from router.economics.cost import token_cost_usd
from router.record.answer import Answer, read_answer
from tidegate.offline.parity.checks import agrees, failures
from tidegate.offline.parity.suite import Case
from tidegate.offline.parity.verdict import Outcome

PATHS = {"chat": "/chat/completions", "responses": "/responses"}
DEFAULT_OUTPUT_TOKENS = 256  # a case without a max_tokens, for the cost estimate
ANSWER_CHARS = 400  # of each answer kept in the run's files


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    base_url: str
    model: str
    api_key: str
    usd_per_mtok: tuple[float, float] | None  # (in, out); None: dedicated, already paid for


@dataclass(frozen=True, slots=True)
class Reply:
    endpoint: str
    case: str
    repeat: int
    answer: Answer | None
    error: str | None
    latency_ms: float | None
    input_tokens: int | None = None


class _Transient(Exception):
    """A 429, a 5xx or a transport error: worth another try."""


def estimate_usd(endpoint: Endpoint, cases: Sequence[Case], repeat: int) -> float | None:
    """The most the run can cost on this endpoint (None: dedicated): every prompt at about four
    characters a token, every answer at its max_tokens (or 256)."""
    if endpoint.usd_per_mtok is None:
        return None
    price_in, price_out = endpoint.usd_per_mtok
    total = 0.0
    for case in cases:
        prompt = len(orjson.dumps(case.request)) // 4 + 8
        total += token_cost_usd(prompt, case.max_output_tokens or DEFAULT_OUTPUT_TOKENS, price_in, price_out)
    return total * repeat


async def run_suite(
    endpoints: Sequence[Endpoint],
    cases: Sequence[Case],
    *,
    repeat: int,
    concurrency: int,
    timeout_s: float,
    attempts: int = 3,
    done: Callable[[Reply], None] = lambda reply: None,
) -> list[Reply]:
    """Every (endpoint, case, repeat) once; `done` hears of each reply as it comes."""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as client:

        async def one(endpoint: Endpoint, case: Case, index: int) -> Reply:
            async with gate:
                reply = await _ask(client, endpoint, case, index, attempts)
            done(reply)
            return reply

        jobs = [one(e, c, i) for c in cases for i in range(repeat) for e in endpoints]
        return list(await asyncio.gather(*jobs))


async def _ask(client: httpx.AsyncClient, endpoint: Endpoint, case: Case, index: int, attempts: int) -> Reply:
    body = {**case.request, "model": endpoint.model}
    headers = {"authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    url = endpoint.base_url.rstrip("/") + PATHS[case.api]
    started = time.perf_counter()
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(attempts),
            wait=wait_exponential_jitter(initial=0.5, max=8.0),
            retry=retry_if_exception_type(_Transient),
            reraise=True,
        ):
            with attempt:
                response = await _post(client, url, body, headers)
    except _Transient as exc:
        return Reply(endpoint.name, case.id, index, None, str(exc), None)
    latency = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        return Reply(endpoint.name, case.id, index, None, f"http_{response.status_code}", latency)
    try:
        parsed = orjson.loads(response.content)
        answer = read_answer(case.api, parsed)
    except ValueError as exc:  # orjson's decode error is a ValueError too
        return Reply(endpoint.name, case.id, index, None, f"not an answer: {exc}"[:120], latency)
    return Reply(endpoint.name, case.id, index, answer, None, latency, _input_tokens(parsed))


async def _post(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> httpx.Response:
    try:
        response = await client.post(url, content=orjson.dumps(body), headers=headers | _JSON)
    except httpx.HTTPError as exc:
        raise _Transient(type(exc).__name__) from exc
    if response.status_code == 429 or response.status_code >= 500:
        raise _Transient(f"http_{response.status_code}")
    return response


_JSON = {"content-type": "application/json"}


def _input_tokens(body: Any) -> int | None:
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None
    value = usage.get("prompt_tokens", usage.get("input_tokens"))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def score(
    replies: Sequence[Reply], cases: Sequence[Case], endpoints: Sequence[Endpoint], reference: str
) -> list[Outcome]:
    """Each reply checked against its case and compared with the reference's answers."""
    by_case = {c.id: c for c in cases}
    prices = {e.name: e.usd_per_mtok for e in endpoints}
    references: dict[str, list[Answer]] = {}
    for r in replies:
        if r.endpoint == reference and r.answer is not None:
            references.setdefault(r.case, []).append(r.answer)
    outcomes = []
    for r in replies:
        case, answer = by_case[r.case], r.answer
        if answer is None:
            outcomes.append(Outcome(r.endpoint, r.case, r.repeat, r.error, latency_ms=r.latency_ms))
            continue
        price = prices[r.endpoint]
        cost = 0.0
        if price is not None:
            cost = token_cost_usd(r.input_tokens or 0, answer.output_tokens or 0, price[0], price[1])
        agreed = None if r.endpoint == reference else agrees(case, answer, references.get(r.case, []))
        outcomes.append(
            Outcome(
                r.endpoint,
                r.case,
                r.repeat,
                None,
                tuple(failures(case, answer)),
                agreed,
                answer.refused,
                answer.output_tokens,
                cost,
                r.latency_ms,
                _kept(answer),
            )
        )
    return outcomes


def _kept(answer: Answer) -> dict[str, Any]:
    return {
        "text": answer.text[:ANSWER_CHARS],
        "tool_calls": [{"name": c.name, "arguments": c.arguments[:ANSWER_CHARS]} for c in answer.tool_calls],
        "finish_reason": answer.finish_reason,
    }
