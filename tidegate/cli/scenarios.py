"""`tidegate demo --scenario NAME`: runnable local playgrounds. Each is a config in
router/examples/, the simulated upstreams it points at (by the env variables its URLs use),
and what to try with what to expect. Imported only by the demo (it loads the simulator)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tidegate.sim.profile import SERVERLESS_PRESETS, Faults, Kind, SimProfile

ANSWER_TOKENS_P50 = 200  # answers end on their own ("stop"), as a model's do


@dataclass(frozen=True, slots=True)
class Scenario:
    config: str  # a file in router/examples/
    sims: Mapping[str, SimProfile]  # env variable of its URL -> the simulator behind it
    summary: str
    try_this: str  # what to do and what to expect, printed at start
    needs_key: bool = field(default=False)


def _dedicated(name: str, served: str, capacity: int = 4, faults: Faults | None = None) -> SimProfile:
    return SimProfile(
        kind=Kind.DEDICATED,
        name=name,
        max_concurrency=capacity,
        served_models=(served,),
        answer_tokens_p50=ANSWER_TOKENS_P50,
        faults=faults or Faults(),
    )


def _serverless(name: str, served: str, preset: str, faults: Faults | None = None) -> SimProfile:
    return SimProfile(
        kind=Kind.SERVERLESS,
        name=name,
        ttft=SERVERLESS_PRESETS[preset],
        served_models=(served,),
        answer_tokens_p50=ANSWER_TOKENS_P50,
        faults=faults or Faults(),
    )


def _default_sims() -> dict[str, SimProfile]:
    return {
        "DEMO_DEDICATED_URL": _dedicated("sim-dedicated", "demo/dedicated-model"),
        "DEMO_SERVERLESS_A_URL": _serverless("sim-provider-a", "demo-model", "deepseek-a"),
        "DEMO_SERVERLESS_B_URL": _serverless("sim-provider-b", "demo/model", "kimi-b"),
    }


SCENARIOS: Mapping[str, Scenario] = MappingProxyType(
    {
        "default": Scenario(
            "demo.yaml",
            _default_sims(),
            "one model: a dedicated sim (4 sequences), spilling to two serverless sims",
            "a canary run moves demo-model's traffic to dedicated in steps (25% -> 50% -> 100%, one "
            "analysis per 20 s of traffic). Once it is at 100%, send more than 4 requests at once: "
            "the 5th spills (x-tidegate-reason: saturated).",
        ),
        "faults": Scenario(
            "demo-faults.yaml",
            {
                "DEMO_DEDICATED_URL": _dedicated(
                    "flaky-dedicated", "demo/dedicated-model", faults=Faults(error_rate=0.5)
                ),
                "DEMO_SERVERLESS_A_URL": _serverless(
                    "rate-limited", "demo-model", "fast", Faults(rate_limit_rate=0.5, retry_after_s=1.0)
                ),
                "DEMO_SERVERLESS_B_URL": _serverless(
                    "stream-cutter", "demo/model", "fast", Faults(cut_rate=0.3)
                ),
            },
            "a dedicated sim failing half its requests, a provider answering 429 half the time, "
            "one cutting a third of its streams",
            "Send 20 requests: x-tidegate-outcome says failed_over_ok or retried_ok; after 5 failures\n"
            "in a row the dedicated circuit opens (x-tidegate-reason: circuit_open) for 10 s. Streams\n"
            "served by stream-cutter may end with an error event (code upstream_stream_cut).",
        ),
        "auth": Scenario(
            "demo-auth.yaml",
            _default_sims(),
            "the default topology, behind client and admin keys",
            "Without a key: 401 invalid_api_key. With api_key='demo-key' (or $TIDEGATE_API_KEY): 200.\n"
            "The admin API wants 'Authorization: Bearer demo-admin'.",
            needs_key=True,
        ),
        "tight": Scenario(
            "demo-tight.yaml",
            {"DEMO_DEDICATED_URL": _dedicated("one-slot", "demo/dedicated-model", capacity=1)},
            "one dedicated slot, nowhere to spill",
            "Start a long stream, then send a second request while it runs: 503 no_capacity with\n"
            "Retry-After and x-should-retry: true, every time (the SDKs retry it after the wait).",
        ),
    }
)
