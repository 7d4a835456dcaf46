"""What one forward pass of a vLLM V1 replica costs, and what a replica can take an hour.

vLLM V1 runs one forward pass ("step") at a time, and a step carries every running sequence's
next decode token together with prompt chunks (chunked prefill), up to `max_num_batched_tokens`
tokens. So prefill and decode share the GPU's time: a step with a prompt chunk in it is longer
for every sequence decoding beside it. A step costs

    step_fixed_s                       the weights read once (memory bound)
  + step_per_seq_s x decoding          each decoding sequence's KV reads and sampling
  + step_per_prompt_token_s x prompt   each prompt token's FLOPs (1 / the marginal prefill rate)

and the decode part is at least `decoding / decode_tokens_per_s` where an aggregate ceiling is
known. Capacity is therefore additive, seconds per task = in x per-token + out x per-step /
batch, not the tighter of two budgets side by side (`min(in/P, out/D)` gave prefill away free).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

VLLM_MAX_NUM_SEQS = 1024  # vLLM V1's default on H100/H200-class GPUs
VLLM_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM V1's default chunked-prefill budget for online serving


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One replica's step costs (seconds) and limits (sequences, tokens)."""

    step_fixed_s: float
    step_per_seq_s: float
    step_per_prompt_token_s: float
    decode_tokens_per_s: float = math.inf
    max_num_seqs: int = VLLM_MAX_NUM_SEQS
    max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS
    kv_capacity_tokens: float = math.inf  # the KV cache, in tokens (prompt and output alike)

    def step_s(self, decoding: int, prompt_tokens: int = 0) -> float:
        """One step carrying `decoding` decode tokens and `prompt_tokens` prompt tokens."""
        decode = self.step_fixed_s + self.step_per_seq_s * decoding
        ceiling = decoding / self.decode_tokens_per_s
        return max(decode, ceiling) + self.step_per_prompt_token_s * prompt_tokens

    @property
    def prefill_tokens_per_s(self) -> float:
        """The marginal prefill rate: prompt tokens per second of added step time."""
        return 1.0 / self.step_per_prompt_token_s

    def prefill_rate(self, decoding: int) -> float:
        """Prompt tokens a second with `decoding` sequences decoding beside full chunks: what a
        queue of prompts drains at (what predicted-TTFT admission's line converges to)."""
        chunk = max(1, self.max_num_batched_tokens - decoding)
        return chunk / self.step_s(decoding, chunk)

    def concurrency(self, mean_in: float, mean_out: float) -> int:
        """The sequences a full replica runs at once: `max_num_seqs`, or fewer when the KV cache
        binds (a sequence holds its prompt and, on average, half its output)."""
        per_sequence = max(mean_in + mean_out / 2, 1.0)
        fits = self.kv_capacity_tokens / per_sequence
        return max(1, self.max_num_seqs if fits >= self.max_num_seqs else math.floor(fits))

    def seconds_per_task(self, mean_in: float, mean_out: float, running: int) -> float:
        """GPU seconds one task of this size costs with `running` sequences sharing each step."""
        per_token = self.step_s(running) / max(running, 1)
        return mean_in * self.step_per_prompt_token_s + max(mean_out, 1.0) * per_token

    def tasks_per_hour(self, mean_in: float, mean_out: float) -> float:
        """Tasks of this mean size a full replica completes an hour (prefill and decode share it)."""
        running = self.concurrency(mean_in, mean_out)
        return 3600.0 / self.seconds_per_task(mean_in, mean_out, running)

    def decode_capacity_tokens_per_s(self, mean_in: float = 0.0, mean_out: float = 0.0) -> float:
        """Decode tokens a second with the engine full and no prompt in its steps."""
        running = self.concurrency(mean_in, mean_out) if mean_in or mean_out else self.max_num_seqs
        return running / self.step_s(running)
