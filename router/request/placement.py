"""What placement reads of a request before its policy decides (policies/placement.py): the
session it belongs to, and which dedicated replica probably holds its prompt's prefix in cache.

The prefix index is this gateway process's own: for each replica, the prompt-prefix blocks
this process sent it lately (an LRU of block hashes, `routing.placement.index_blocks` per
replica). Kept per process, it costs no round trip on the request path and no Redis memory;
the price is that N gateway replicas may each warm a different replica with the same prefix
until their own traffic points them to one. A prefix no process has seen yet is placed by a
rendezvous hash (policies/placement.py), the same on every gateway replica, so a new shared
system prompt lands on one replica from all of them while loads are even.

A block is `prefix_block_bytes` of the prompt field's JSON as the client wrote it (`messages`,
`prompt` or `input`); its hash chains every block before it, so equal hashes mean equal
prefixes, as in vLLM's own prefix cache. A partial last block is not counted: an engine
caches whole blocks only.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

from policies.base import NO_HITS
from policies.predicted_ttft import Admission
from policies.types import route_key
from router.config import ModelConfig
from router.openai import UpstreamBody

PROMPT_FIELDS = ("messages", "prompt", "input")


def prompt_blocks(body: UpstreamBody, block_bytes: int, max_blocks: int) -> tuple[int, ...]:
    """The chained hashes of the prompt field's whole blocks, at most `max_blocks`."""
    fields = body.fields()
    raw = next((fields[name] for name in PROMPT_FIELDS if name in fields), None)
    if raw is None:
        return ()
    text = memoryview(bytes(raw))
    count = min(len(text) // block_bytes, max_blocks)
    chain = hashlib.blake2b(digest_size=8)
    blocks = []
    for start in range(0, count * block_bytes, block_bytes):
        chain.update(text[start : start + block_bytes])
        blocks.append(int.from_bytes(chain.digest(), "big"))
    return tuple(blocks)


class PrefixIndex:
    """Per replica (by route key), the block hashes this process sent it, least recent first."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._held: dict[str, OrderedDict[int, None]] = {}

    def shares(self, model: str, blocks: Sequence[int], replicas: Iterable[str]) -> Mapping[str, float]:
        """Each replica's share of `blocks` held from the first on (a miss ends its prefix)."""
        if not blocks:
            return NO_HITS
        shares: dict[str, float] = {}
        for name in replicas:
            held = self._held.get(route_key(model, name))
            if not held:
                continue
            matched = 0
            for block in blocks:
                if block not in held:
                    break
                matched += 1
            if matched:
                shares[name] = matched / len(blocks)
        return shares or NO_HITS

    def served(self, model: str, replica: str, blocks: Sequence[int]) -> None:
        """`replica` was sent these blocks: it holds them now, most recent last."""
        if not blocks or self._capacity <= 0:
            return
        held = self._held.setdefault(route_key(model, replica), OrderedDict())
        for block in blocks:
            held[block] = None
            held.move_to_end(block)
        while len(held) > self._capacity:
            held.popitem(last=False)

    def forget(self, model: str, replica: str) -> None:
        """A replica left (or restarted with a cold cache): nothing of it is assumed held."""
        self._held.pop(route_key(model, replica), None)


class PlacementInputs:
    """The session and prefix shares a model's placer reads; nothing for a model with fewer
    than two dedicated replicas, whose placement has nothing to choose."""

    def __init__(self, models: Mapping[str, ModelConfig]) -> None:
        self._indexes = {
            name: PrefixIndex(m.routing.placement.index_blocks)
            for name, m in models.items()
            if len(m.dedicated) > 1 and m.routing.placement.uses_prefix
        }

    def read(
        self, config: ModelConfig, model: str, body: UpstreamBody
    ) -> tuple[tuple[int, ...], Mapping[str, float]]:
        """The prompt's prefix blocks and each replica's share of them (none without an index)."""
        index = self._indexes.get(model)
        if index is None:
            return (), NO_HITS
        placement = config.routing.placement
        blocks = prompt_blocks(body, placement.prefix_block_bytes, placement.max_prefix_blocks)
        return blocks, index.shares(model, blocks, (d.name for d in config.dedicated))

    def forget(self, model: str, replica: str) -> None:
        """`replica` is another engine now (a DNS pool's slot set moved): its cache starts cold."""
        index = self._indexes.get(model)
        if index is not None:
            index.forget(model, replica)

    def served(self, model: str, replica: str, blocks: Sequence[int]) -> None:
        index = self._indexes.get(model)
        if index is not None:
            index.served(model, replica, blocks)


def session_of(session: str | None, task_id: str | None) -> str | None:
    """Placement's session: the `x-tidegate-session` header, else the client's task id."""
    return session if session is not None else task_id


def counts_pending(config: ModelConfig) -> bool:
    """Whether a request's prompt tokens count as pending prefill on its pool until its first
    token: for predicted-TTFT admission, and for placement among replicas when it reads them."""
    return config.routing.admission is Admission.PREDICTED_TTFT or (
        config.routing.placement.counts_pending and len(config.dedicated) > 1
    )


def tie_key(user: str | None, blocks: Sequence[int]) -> str | None:
    """Placement's tie-break without a session: the request's `user`, else its prompt's first
    block, so a new shared system prompt lands on one replica from every gateway replica."""
    return user or (f"prefix:{blocks[0]:016x}" if blocks else None)
