"""The simulator's knobs, with documented defaults and the serverless presets.

Every duration is in real seconds at `time_scale` 1; the simulator divides each delay by
`time_scale`, so a scenario runs `time_scale` times faster with the same shape.

Dedicated defaults describe one vLLM replica of a mid-size model (an 8B-class model on one
H100-class GPU), run by the shared-step engine (router/engine): each step carries the decoding
sequences' tokens and prompt chunks, costs `itl_s` + `itl_per_seq_s` per decoding sequence + a
prompt token's 1/`prefill_tokens_per_s` (~8,000 tokens/s), with the decode part at least the
batch over the aggregate `decode_tokens_per_s` (~1,600); `max_concurrency` sequences run at
once (vLLM's `max_num_seqs`) and the rest wait FIFO. These are order-of-magnitude figures, not
a measurement of any particular deployment: replace them with your own (`vllm bench serve`
against your endpoint), or start from a calibration (`tidegate sim --calibration NAME`).

Serverless presets reproduce the TTFT tables of the field notes (docs/simulator.md):
a log-normal body around the measured p50, a "slow tail" component that moves p95, and rare
cold loads of 10-90 s (the seed's stated model load times). The p50 and p95 of each preset
match the table within ~10% (tests/router/test_sim.py samples them); the CV is lower than
the table's extreme values because the cold loads are capped at 90 s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from policies.types import EndpointKind
from tidegate.offline.calibration import SERVERLESS_PRESETS, TtftDistribution

Kind = EndpointKind  # a simulator plays one of the gateway's endpoint kinds
__all__ = ["SERVERLESS_PRESETS", "Faults", "Kind", "Persona", "SimProfile", "TtftDistribution"]


class Persona(StrEnum):
    """How the simulated model's answers diverge from a faithful one's (tidegate/sim/persona.py)."""

    FAITHFUL = "faithful"
    SCHEMA_DRIFT = "schema-drift"
    TOOL_DRIFT = "tool-drift"
    REFUSER = "refuser"


@dataclass(frozen=True, slots=True)
class Faults:
    """Injected failures; each rate is a probability per request in [0, 1]."""

    error_rate: float = 0.0  # answer 500 or 503 (equally likely)
    rate_limit_rate: float = 0.0  # answer 429 with Retry-After
    retry_after_s: float = 1.0
    stall_rate: float = 0.0  # wait `stall_s` before sending anything
    stall_s: float = 30.0
    cut_rate: float = 0.0  # streams: drop the connection halfway through the output
    reject_rate: float = 0.0  # answer 400 (context length exceeded): the request's fault


@dataclass(frozen=True, slots=True)
class SimProfile:
    kind: Kind = Kind.DEDICATED
    name: str = "sim"
    time_scale: float = 1.0
    seed: int | None = None
    default_output_tokens: int = 16  # when the request sets no max_tokens (answer_tokens_p50 unset)
    max_output_tokens: int = 4096
    # answers' lengths: None runs every answer to max_tokens; a median samples them (log-normal),
    # so an answer shorter than max_tokens ends with finish_reason "stop", like a real model's
    answer_tokens_p50: int | None = None
    tool_call_share: float = 1.0  # with tools and tool_choice "auto": the share that calls one
    served_models: tuple[str, ...] = ()  # model ids it serves (404 for others); empty: any
    # dedicated
    max_concurrency: int = 16
    prefill_tokens_per_s: float = 8000.0
    itl_s: float = 0.020  # per-sequence inter-token latency while the batch is small
    itl_per_seq_s: float = 0.0  # the decode step grows this much per running sequence
    decode_tokens_per_s: float = 1600.0  # the replica's aggregate decode rate
    overhead_s: float = 0.0  # fixed time to first token on top of the prefill (scheduling, sampling)
    max_num_batched_tokens: int = 8192  # tokens one step carries, prompt chunks included (vLLM V1)
    kv_capacity_tokens: float = float("inf")  # the KV cache in tokens (a sequence holds prompt + output)
    # the replica's prefix cache (tidegate/sim/prefix_cache.py): 0 keeps none; a hit skips its prefill
    prefix_cache_tokens: int = 0
    prefix_block_tokens: int = 16  # vLLM's block size
    # serverless
    ttft: TtftDistribution = field(default_factory=TtftDistribution)
    serverless_itl_s: float = 0.015
    idle_to_cold_s: float = 0.0  # scale-to-zero: a cold load after this much idle time (0: never)
    # both
    tokens_per_write: int = 1  # a stream sends its events this many at a time (fewer, larger writes)
    slowdown: float = 1.0  # multiplies every delay; raise it to rehearse a degraded upstream
    faults: Faults = field(default_factory=Faults)
    # how its answers diverge from a faithful model's (tidegate/sim/persona.py), on this share
    persona: Persona = Persona.FAITHFUL
    persona_share: float = 0.3

    def decode_step_s(self, running: int) -> float:
        """One sequence's inter-token interval with `running` sequences in the batch."""
        return max(self.itl_s + self.itl_per_seq_s * running, running / self.decode_tokens_per_s)

    def delay(self, seconds: float) -> float:
        """A modelled duration converted to the real seconds to sleep."""
        return seconds * self.slowdown / self.time_scale
