"""The simulated OpenAI-compatible upstream as an ASGI app (`tidegate sim` serves it).

Routes: POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses;
GET /v1/models; GET /sim/stats (JSON counters); PUT /sim/config (change faults, slowdown
and other knobs at run time, JSON merged into the profile); GET /metrics (vLLM-style gauges).
A generation request may carry `x-sim-prompt-tokens` and `x-sim-output-tokens` (what
`tidegate replay` sends for a trace row): the prompt is counted as that many tokens, and the
answer is that long and ends with `stop`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from router.errors import error_body
from router.http.disconnect import unless_client_leaves
from tidegate.sim import answers, bodies, persona, validation
from tidegate.sim.engine import Engine
from tidegate.sim.profile import Persona, SimProfile

_JSON = "application/json"
_KINDS = {"/v1/chat/completions": "chat", "/v1/completions": "text", "/v1/responses": "responses"}


class StreamCut(Exception):
    """Raised inside a stream to drop the connection mid-way (the `cut` fault)."""


class SimState:
    """The live profile (replaceable through PUT /sim/config) and the engine."""

    def __init__(self, profile: SimProfile) -> None:
        self.profile = profile
        self.engine = Engine(lambda: self.profile)
        self.last_traceparent: str | None = None  # W3C trace context of the latest request

    def update(self, changes: dict[str, Any]) -> None:
        faults = changes.pop("faults", None)
        ttft = changes.pop("ttft", None)
        if "persona" in changes:
            changes["persona"] = Persona(changes["persona"])  # ValueError: a 400
        profile = dataclasses.replace(self.profile, **changes)
        if isinstance(faults, dict):
            profile = dataclasses.replace(profile, faults=dataclasses.replace(profile.faults, **faults))
        if isinstance(ttft, dict):
            profile = dataclasses.replace(profile, ttft=dataclasses.replace(profile.ttft, **ttft))
        self.profile = profile


def create_sim_app(profile: SimProfile) -> Starlette:
    state = SimState(profile)
    routes = [Route(path, _generation(state, kind), methods=["POST"]) for path, kind in _KINDS.items()]
    routes += [
        Route("/v1/embeddings", _embeddings(state), methods=["POST"]),
        Route("/v1/models", _models(state), methods=["GET"]),
        Route("/sim/stats", _stats(state), methods=["GET"]),
        Route("/sim/config", _config(state), methods=["PUT", "GET"]),
        Route("/metrics", _metrics(state), methods=["GET"]),
    ]
    app = Starlette(routes=routes)
    app.state.sim = state
    return app


def _generation(state: SimState, kind: str) -> Any:
    async def endpoint(request: Request) -> Response:
        payload, failure = await _read(request, state, kind)
        if failure is not None:
            return failure
        model = str(payload.get("model", state.profile.name))
        profile = state.profile
        wanted_out = _header_tokens(request, "x-sim-output-tokens")
        if wanted_out is not None:  # a replayed trace row: its answer length, ending with `stop`
            profile = replace(profile, default_output_tokens=wanted_out, answer_tokens_p50=None)
        choices = answers.plan(payload, profile, state.engine.rng)
        choices = persona.apply(profile.persona, profile.persona_share, profile.seed, payload, choices)
        prompt = _prompt_bytes(payload)
        n_in = _header_tokens(request, "x-sim-prompt-tokens") or _input_tokens(prompt)
        n_out = sum(c.tokens for c in choices)
        logprobs = _logprobs(payload, kind)
        if payload.get("stream") is True:
            include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
            writer = bodies.StreamWriter(kind, model, choices, include_usage, logprobs)
            events = _stream(state, writer, n_in, n_out, prompt)
            return StreamingResponse(events, media_type="text/event-stream")
        steps = max(max(len(c.pieces), 1) for c in choices)
        if await unless_client_leaves(request.receive, _generate(state, n_in, steps, prompt)) is None:
            return Response(status_code=499)  # the client left: like vLLM, abort the sequence
        use = bodies.usage(kind, n_in, n_out)
        _count_usage(state, n_in, n_out)
        return Response(bodies.completion(kind, model, choices, use, logprobs), media_type=_JSON)

    return endpoint


def _logprobs(payload: dict[str, Any], kind: str) -> int | None:
    """How many alternatives per token the request wants logprobs with; None for none."""
    if kind == "chat":
        if payload.get("logprobs") is not True:
            return None
        top = payload.get("top_logprobs")
        return top if isinstance(top, int) and not isinstance(top, bool) else 0
    value = payload.get("logprobs")
    return value if kind == "text" and isinstance(value, int) and not isinstance(value, bool) else None


async def _generate(state: SimState, n_in: int, steps: int, prompt: bytes = b"") -> bool:
    async with state.engine.sequence(n_in, prompt) as seq:
        await seq.first_token()
        per_write = max(1, state.profile.tokens_per_write)
        for start in range(1, steps, per_write):
            await seq.next_token(min(per_write, steps - start))
    return True


async def _stream(
    state: SimState, writer: bodies.StreamWriter, n_in: int, n_out: int, prompt: bytes = b""
) -> AsyncIterator[bytes]:
    steps = writer.steps
    cut_at = steps // 2 if state.engine.rng.random() < state.profile.faults.cut_rate else -1
    per_write = max(1, state.profile.tokens_per_write)
    async with state.engine.sequence(n_in, prompt) as seq:
        await seq.first_token()
        yield writer.opening() + writer.step(0)
        for start in range(1, steps, per_write):
            group = range(start, min(start + per_write, steps))
            if cut_at in group:
                state.engine.count_fault("cut")
                state.engine.counters.cut_output_events += start
                raise StreamCut("simulated connection drop")
            await seq.next_token(len(group))
            yield b"".join(writer.step(i) for i in group)
    if writer.include_usage:
        _count_usage(state, n_in, n_out)
    yield writer.closing(bodies.usage(writer.kind, n_in, n_out))


def _count_usage(state: SimState, n_in: int, n_out: int) -> None:
    state.engine.counters.usage_prompt_tokens += n_in
    state.engine.counters.usage_completion_tokens += n_out


def _embeddings(state: SimState) -> Any:
    async def endpoint(request: Request) -> Response:
        payload, failure = await _read(request, state, "embeddings")
        if failure is not None:
            return failure
        inputs = payload.get("input")
        count = len(inputs) if isinstance(inputs, list) and inputs and not isinstance(inputs[0], int) else 1
        n_in = _input_tokens(_prompt_bytes(payload))
        dimensions = payload.get("dimensions")
        size = dimensions if isinstance(dimensions, int) and not isinstance(dimensions, bool) else 8
        encoding = "base64" if payload.get("encoding_format") == "base64" else "float"
        async with state.engine.sequence(n_in) as seq:
            await seq.first_token()
        body = bodies.embeddings(str(payload.get("model")), count, n_in, size, encoding)
        return Response(body, media_type=_JSON)

    return endpoint


async def _read(request: Request, state: SimState, kind: str) -> tuple[dict[str, Any], Response | None]:
    """The parsed body, or an early answer: a request vLLM would refuse, or an injected fault."""
    state.last_traceparent = request.headers.get("traceparent")
    state.engine.count_request()
    try:
        payload = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return {}, _error(400, "invalid JSON body", "invalid_request_error")
    if not isinstance(payload, dict):
        return {}, _error(400, "body must be an object", "invalid_request_error")
    problem = validation.problem(payload, kind)
    if problem is not None:
        return {}, _error(400, problem, "invalid_request_error")
    served = state.profile.served_models
    if served and payload.get("model") not in served:
        message = f"The model `{payload.get('model')}` does not exist."
        return {}, _error(404, message, "NotFoundError")
    return payload, await _inject(state, request)


async def _inject(state: SimState, request: Request) -> Response | None:
    faults, engine, rng = state.profile.faults, state.engine, state.engine.rng
    if rng.random() < faults.stall_rate:
        engine.count_fault("stall")
        if not await _stall(request, state.profile.delay(faults.stall_s)):
            engine.counters.cancelled += 1  # the client gave up on the stalled request
            return _error(499, "client closed the request", "cancelled")
    if rng.random() < faults.rate_limit_rate:
        engine.count_fault("429")
        response = _error(429, "Rate limit reached (simulated)", "rate_limit_exceeded")
        response.headers["retry-after"] = f"{faults.retry_after_s:g}"
        return response
    if rng.random() < faults.reject_rate:
        engine.count_fault("400")
        message = "This model's maximum context length is exceeded (simulated)"
        return _error(400, message, "invalid_request_error")
    if rng.random() < faults.error_rate:
        status = rng.choice((500, 503))
        engine.count_fault(str(status))
        return _error(status, "The server had an error (simulated)", "server_error")
    return None


async def _stall(request: Request, seconds: float) -> bool:
    """Sleep `seconds`; False as soon as the client disconnects instead (a gateway hedging a
    stalled first token cancels it: the count of those is how a test sees the losers)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    sleep = asyncio.ensure_future(asyncio.sleep(seconds))
    gone = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({sleep, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleep.cancel()
        gone.cancel()
    return gone not in done


def _error(status: int, message: str, kind: str) -> Response:
    return Response(error_body(message, kind, None, None), status_code=status, media_type=_JSON)


def _header_tokens(request: Request, name: str) -> int | None:
    """A token count a replay sends instead of a real prompt or answer (1 .. 1,000,000)."""
    value = request.headers.get(name)
    if value is None or not value.isdigit():
        return None
    return min(max(int(value), 1), 1_000_000)


def _input_tokens(prompt: bytes) -> int:
    return max(1, len(prompt) // 4)


def _prompt_bytes(payload: dict[str, Any]) -> bytes:
    """The prompt as the simulator counts and caches it: its messages (or prompt, or input) as JSON."""
    return orjson.dumps(payload.get("messages", payload.get("prompt", payload.get("input", ""))))


def _models(state: SimState) -> Any:
    async def endpoint(request: Request) -> Response:
        names = state.profile.served_models or (state.profile.name,)
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "sim"} for name in names]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type=_JSON)

    return endpoint


def _stats(state: SimState) -> Any:
    async def endpoint(request: Request) -> Response:
        c = state.engine.counters
        waits = sorted(c.queue_waits_s)
        body = {
            "kind": state.profile.kind,
            "requests": c.requests,
            "in_flight": c.in_flight,
            "running": c.running,
            "queued": c.queued,
            "max_in_flight": c.max_in_flight,
            "max_running": c.max_running,
            "completed": c.completed,
            "cancelled": c.cancelled,
            "cold_starts": c.cold_starts,
            "prefill_tokens": c.prefill_tokens,  # computed by the dedicated replica
            "prefix_hit_tokens": c.prefix_hit_tokens,  # skipped: found in its prefix cache
            "faults": c.faults,
            "usage_prompt_tokens": c.usage_prompt_tokens,
            "usage_completion_tokens": c.usage_completion_tokens,
            "cut_output_events": c.cut_output_events,
            "last_traceparent": state.last_traceparent,
            "first_token_delays_ms": [d * 1000 for d in c.first_token_delays_s],
            "queue_wait_ms": {
                "count": len(waits),
                "mean": statistics.fmean(waits) * 1000 if waits else 0.0,
                "p50": waits[len(waits) // 2] * 1000 if waits else 0.0,
                "max": waits[-1] * 1000 if waits else 0.0,
            },
        }
        return Response(orjson.dumps(body), media_type=_JSON)

    return endpoint


def _config(state: SimState) -> Any:
    async def endpoint(request: Request) -> Response:
        if request.method == "PUT":
            try:
                changes = orjson.loads(await request.body())
                state.update(dict(changes))
            except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
                return _error(400, f"bad config change: {exc}", "invalid_request_error")
        return Response(orjson.dumps(dataclasses.asdict(state.profile)), media_type=_JSON)

    return endpoint


class _PromptTokens(Collector):
    """vLLM's `vllm:request_prompt_tokens` histogram of finished requests (sum and count)."""

    def __init__(self, state: SimState) -> None:
        self._state = state

    def collect(self) -> Iterator[HistogramMetricFamily]:
        c = self._state.engine.counters
        family = HistogramMetricFamily(
            "vllm:request_prompt_tokens", "Prompt tokens of finished requests", labels=["model_name"]
        )
        buckets = [("+Inf", float(c.completed))]
        family.add_metric([self._state.profile.name], buckets=buckets, sum_value=c.completed_prompt_tokens)
        yield family


def _metrics(state: SimState) -> Any:
    registry = CollectorRegistry()
    labels = ["model_name"]
    running = Gauge("vllm:num_requests_running", "Requests in the running batch", labels, registry=registry)
    waiting = Gauge(
        "vllm:num_requests_waiting", "Requests waiting to be scheduled", labels, registry=registry
    )
    kv = Gauge("vllm:kv_cache_usage_perc", "KV cache usage, 1 means full", labels, registry=registry)
    registry.register(_PromptTokens(state))

    async def endpoint(request: Request) -> Response:
        c, p = state.engine.counters, state.profile
        running.labels(p.name).set(c.running)
        waiting.labels(p.name).set(c.queued)
        kv.labels(p.name).set(min(1.0, c.running / p.max_concurrency))
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    return endpoint
