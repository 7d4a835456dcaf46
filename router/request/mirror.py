"""Is this live request one to mirror to its model's shadow endpoint (router/spill/shadow.py)?
Decided when it arrives, so a stream's text is gathered for the comparison."""

from __future__ import annotations

from policies.canary import bucket
from router.config import ModelConfig
from router.openai import RequestPeek


def mirrored(config: ModelConfig, request: RequestPeek, request_id: str, no_shadow: bool = False) -> bool:
    """`shadow.percent` of requests (by request id), unless the client said
    `x-tidegate-no-shadow: 1` or the prompt is over `shadow.max_prompt_tokens` (estimated)."""
    shadow = config.shadow
    if shadow is None or no_shadow or request.prompt_tokens > shadow.max_prompt_tokens:
        return False
    return bucket(f"{request.model}\x00shadow", request_id) < shadow.percent
