"""A replica's prefix cache, as vLLM's automatic prefix caching keeps it: the prompt cut into
fixed blocks, each block named by the hash of itself and every block before it, the blocks kept
in LRU order up to a capacity in tokens. A request's leading blocks found in the cache skip
their prefill; every full block of its prompt is then (re)inserted as most recent.

The simulator counts tokens as 4 bytes of the prompt's JSON (tidegate/sim/app.py), so a block of
`block_tokens` is that many times 4 bytes. Bounded: at most capacity / block_tokens hashes.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

BYTES_PER_TOKEN = 4


class PrefixCache:
    def __init__(self, capacity_tokens: int, block_tokens: int = 16) -> None:
        if capacity_tokens < 0 or block_tokens < 1:
            raise ValueError("prefix cache: capacity_tokens >= 0 and block_tokens >= 1")
        self.capacity_tokens, self.block_tokens = capacity_tokens, block_tokens
        self._max_blocks = capacity_tokens // block_tokens
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def cached_tokens(self, prompt: bytes, prompt_tokens: int) -> int:
        """The prompt tokens a request finds cached (its leading blocks), after which its full
        blocks are the most recently used. At least one token is always computed."""
        if self._max_blocks == 0:
            return 0
        size = self.block_tokens * BYTES_PER_TOKEN
        chain = hashlib.blake2b(digest_size=16)
        hits, leading = 0, True
        for start in range(0, len(prompt) - size + 1, size):
            chain.update(prompt[start : start + size])
            name = chain.digest()
            if leading and name in self._blocks:
                hits += 1
            else:
                leading = False
            self._blocks[name] = None
            self._blocks.move_to_end(name)
            while len(self._blocks) > self._max_blocks:
                self._blocks.popitem(last=False)
        return min(hits * self.block_tokens, max(0, prompt_tokens - 1))
