"""Named calibrations: published figures for a dedicated replica and a serverless endpoint, so
`tidegate sim` and `tidegate plan` start from real numbers rather than guesses.

Every figure is a parameter: a calibration is only the defaults a command starts from, and
each command-line flag overrides its own figure.

`deepseek-r1-h200` is one 8xH200 node serving a DeepSeek-R1-class model with vLLM (TP 8):
- prefill ~16.5k prompt tokens/s marginal: each prompt token adds 1/16,500 s to the step it
  rides in (vLLM puts prompt chunks and decode tokens in one step, up to 8,192 tokens);
- decode step 18.6 ms + 0.1 ms per running sequence;
- KV cache ~600k tokens (MLA's latent, ~70 KB a token in FP8, replicated on each of the 8
  GPUs: 141 GB x 0.9 less 84 GB of weights per GPU);
- ~80 ms fixed time to first token (scheduling, sampling, detokenisation);
- $6.31 per H200 GPU-hour (CoreWeave's list), 8 GPUs: $50.48 per node-hour. At an H100 rate
  ($4.41, what this calibration used before) the node is $35.28: pass `--gpu-hour-usd 4.41`.
The figures are fitted to GPUStack's published DeepSeek-R1 on H200 throughput runs and the vLLM
DeepSeek recipes (sources in docs/replay-and-plan.md).

`deepseek-serverless` is a pay-per-token DeepSeek endpoint at $0.55 / $2.19 per million input /
output tokens (DeepSeek's list price) with the field notes' warm TTFT (seed 000, provider A:
p50 0.39 s) and scale-to-zero after 60 s idle with a 10-30 s cold load.

That pair is the regime where serverless wins (a full node costs more per token than the API).
The open-weight pairs are the regime tidegate exists for, where a reserved GPU that is busy
enough is cheaper per token than the same model's API:
- `llama-8b-h100`: Llama 3.1 8B (BF16) on one H100 SXM with vLLM, paired with
  `llama-8b-together` ($0.18 / $0.18 per M tokens), `llama-8b-wandb` ($0.22 / $0.22) and the
  cheap partners `llama-8b-groq` ($0.05 / $0.08) and `llama-8b-deepinfra` ($0.02 / $0.03);
- `llama-70b-fp8-2xh100`: Llama 3.1/3.3 70B in FP8 on two H100 SXM (TP 2), paired with
  `llama-70b-together` ($0.88 / $0.88), `llama-70b-wandb` ($0.80 / $0.80) and
  `llama-70b-deepinfra` ($0.40 / $0.40).
Every dedicated calibration runs vLLM V1's defaults: `max_num_seqs` 1024 and
`max_num_batched_tokens` 8,192; what binds first is the KV cache (`kv_capacity_tokens`).
The shared-step engine (router/engine) turns these figures into steps; docs/simulator.md checks
it against published measurements.
docs/economics.md cites every figure and shows the arithmetic of those derived from a
datasheet (decode steps from weight bytes over memory bandwidth, prefill from FLOPs).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from router.engine.spec import VLLM_MAX_NUM_BATCHED_TOKENS, VLLM_MAX_NUM_SEQS, EngineSpec


@dataclass(frozen=True, slots=True)
class TtftDistribution:
    """TTFT (s) = lognormal(median `p50_s`, `sigma`) + tail + cold load, see module doc."""

    p50_s: float = 0.39
    sigma: float = 0.2
    tail_prob: float = 0.0
    tail_range_s: tuple[float, float] = (3.0, 12.0)
    cold_prob: float = 0.0
    cold_range_s: tuple[float, float] = (10.0, 90.0)

    def sample(self, rng: random.Random) -> float:
        ttft = math.exp(rng.gauss(math.log(self.p50_s), self.sigma))
        if rng.random() < self.tail_prob:
            ttft += rng.uniform(*self.tail_range_s)
        if rng.random() < self.cold_prob:
            ttft += rng.uniform(*self.cold_range_s)
        return ttft


# Seed 000's table: model and provider -> TTFT shape (p50 / p95 in the comments).
SERVERLESS_PRESETS = MappingProxyType(
    {
        "deepseek-a": TtftDistribution(0.39, 0.2),  # 0.39 / 0.57
        "deepseek-b": TtftDistribution(0.55, 0.2, 0.04, (3.0, 12.0), 0.02),  # 0.55 / 6.30
        "deepseek-c": TtftDistribution(0.73, 0.2, 0.035, (4.0, 12.0), 0.025),  # 0.73 / 6.91
        "kimi-a": TtftDistribution(0.35, 0.2, 0.04, (3.0, 12.0), 0.02),  # 0.35 / 5.98
        "kimi-b": TtftDistribution(0.25, 0.5, 0.06, (0.5, 2.0)),  # 0.25 / 1.08
        "kimi-c": TtftDistribution(0.43, 0.2, 0.08, (0.5, 2.0), 0.007),  # 0.43 / 1.70
        "fast": TtftDistribution(0.02, 0.1),  # for tests and benchmarks
    }
)


@dataclass(slots=True)
class ColdLoad:
    """A scale-to-zero route's warm state. After `idle_to_cold_s` without a request, the next
    one starts a cold load, and every request that arrives before the load ends waits for it:
    a provider loads the model once, not once per request. The model (planner) and the
    simulator both keep one, so a plan and a replay charge a burst after an idle gap alike."""

    last_seen: float = 0.0
    ready_at: float = 0.0
    loads: int = 0

    def wait_s(self, now: float, idle_to_cold_s: float, load_s: Callable[[], float]) -> float:
        """The time a request arriving `now` waits for the model to be loaded."""
        if idle_to_cold_s > 0 and now - self.last_seen > idle_to_cold_s and now >= self.ready_at:
            self.ready_at = now + load_s()
            self.loads += 1
        self.last_seen = now
        return max(0.0, self.ready_at - now)


@dataclass(frozen=True, slots=True)
class DedicatedCalibration:
    prefill_tokens_per_s: float  # marginal: a prompt token adds 1/this to its step
    itl_s: float  # decode step with an empty batch
    itl_per_seq_s: float  # added to the step per decoding sequence
    decode_tokens_per_s: float  # aggregate decode ceiling (inf: the step formula alone)
    overhead_s: float  # fixed part of every time to first token (off the GPU)
    max_num_seqs: int  # the engine's own ceiling; the rest queue FIFO inside it
    gpus: int
    gpu_hour_usd: float
    kv_capacity_tokens: float = float("inf")
    max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS

    @property
    def usd_per_hour(self) -> float:
        return self.gpus * self.gpu_hour_usd

    @property
    def engine(self) -> EngineSpec:
        """These figures as the shared-step engine's (router/engine/spec.py)."""
        return EngineSpec(
            step_fixed_s=self.itl_s,
            step_per_seq_s=self.itl_per_seq_s,
            step_per_prompt_token_s=1.0 / self.prefill_tokens_per_s,
            decode_tokens_per_s=self.decode_tokens_per_s,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            kv_capacity_tokens=self.kv_capacity_tokens,
        )

    @property
    def decode_capacity_tokens_per_s(self) -> float:
        """What a replica decodes per second with `max_num_seqs` decoding and no prompt."""
        return self.engine.decode_capacity_tokens_per_s()

    def tasks_per_hour(self, mean_in: float, mean_out: float) -> float:
        """Tasks of this mean size a full replica completes an hour: prefill and decode share
        its steps, so their seconds add (router/engine/spec.py)."""
        return self.engine.tasks_per_hour(mean_in, mean_out)


@dataclass(frozen=True, slots=True)
class ServerlessCalibration:
    ttft: TtftDistribution
    itl_s: float
    idle_to_cold_s: float  # a cold load after this idle gap (0: never cold)
    usd_per_mtok_in: float
    usd_per_mtok_out: float


DEDICATED = MappingProxyType(
    {
        "deepseek-r1-h200": DedicatedCalibration(
            prefill_tokens_per_s=16_500.0,
            itl_s=0.0186,
            itl_per_seq_s=0.0001,
            decode_tokens_per_s=float("inf"),
            overhead_s=0.080,
            max_num_seqs=VLLM_MAX_NUM_SEQS,
            gpus=8,
            gpu_hour_usd=6.31,
            kv_capacity_tokens=600_000,
        ),
        # 16.1 GB of BF16 weights on 80 GB at 0.9 utilisation leaves ~54 GB: 415k tokens of
        # 128 KiB (32 layers x 8 KV heads x 128 x 2 x 2 bytes)
        "llama-8b-h100": DedicatedCalibration(
            prefill_tokens_per_s=25_000.0,
            itl_s=0.0062,
            itl_per_seq_s=0.00006,
            decode_tokens_per_s=float("inf"),
            overhead_s=0.050,
            max_num_seqs=VLLM_MAX_NUM_SEQS,
            gpus=1,
            gpu_hour_usd=4.41,
            kv_capacity_tokens=415_000,
        ),
        # NIM measures the decode step at 18.6-18.9 ms; prefill is FP8's 1,979 TFLOPS x 2 GPUs
        # at ~50% MFU over 141 GFLOP a token; KV: 2 x (72 - 35.3 - 1.5) GB over 320 KiB a token
        # (vLLM's default BF16 KV cache; FP8 KV doubles it)
        "llama-70b-fp8-2xh100": DedicatedCalibration(
            prefill_tokens_per_s=14_000.0,
            itl_s=0.01875,
            itl_per_seq_s=0.0001,
            decode_tokens_per_s=float("inf"),
            overhead_s=0.080,
            max_num_seqs=VLLM_MAX_NUM_SEQS,
            gpus=2,
            gpu_hour_usd=4.41,
            kv_capacity_tokens=215_000,
        ),
    }
)


def _open_weight_api(
    usd_per_mtok: float, itl_s: float, usd_per_mtok_out: float | None = None
) -> ServerlessCalibration:
    """A pay-per-token open-weight endpoint: one price for input and output (the providers'
    list), the field notes' warm TTFT shape (provider A) and the same scale-to-zero as
    `deepseek-serverless`."""
    return ServerlessCalibration(
        ttft=TtftDistribution(SERVERLESS_PRESETS["deepseek-a"].p50_s, 0.2, cold_range_s=(10.0, 30.0)),
        itl_s=itl_s,
        idle_to_cold_s=60.0,
        usd_per_mtok_in=usd_per_mtok,
        usd_per_mtok_out=usd_per_mtok if usd_per_mtok_out is None else usd_per_mtok_out,
    )


SERVERLESS = MappingProxyType(
    {
        "deepseek-serverless": ServerlessCalibration(
            ttft=TtftDistribution(SERVERLESS_PRESETS["deepseek-a"].p50_s, 0.2, cold_range_s=(10.0, 30.0)),
            itl_s=0.020,
            idle_to_cold_s=60.0,
            usd_per_mtok_in=0.55,
            usd_per_mtok_out=2.19,
        ),
        "llama-8b-together": _open_weight_api(0.18, itl_s=0.010),
        "llama-8b-wandb": _open_weight_api(0.22, itl_s=0.010),
        "llama-8b-groq": _open_weight_api(0.05, itl_s=0.004, usd_per_mtok_out=0.08),
        "llama-8b-deepinfra": _open_weight_api(0.02, itl_s=0.010, usd_per_mtok_out=0.03),
        "llama-70b-together": _open_weight_api(0.88, itl_s=0.020),
        "llama-70b-wandb": _open_weight_api(0.80, itl_s=0.020),
        "llama-70b-deepinfra": _open_weight_api(0.40, itl_s=0.020),
    }
)

# Which serverless calibration prices the same model as each dedicated one (the first is the
# default partner): commands that take a --calibration pick its partner unless told otherwise.
PARTNERS = MappingProxyType(
    {
        "deepseek-r1-h200": ("deepseek-serverless",),
        "llama-8b-h100": ("llama-8b-together", "llama-8b-wandb", "llama-8b-groq", "llama-8b-deepinfra"),
        "llama-70b-fp8-2xh100": ("llama-70b-together", "llama-70b-wandb", "llama-70b-deepinfra"),
    }
)
