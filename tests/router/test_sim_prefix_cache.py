"""The simulator's prefix cache (issue 38, part 3): a replica keeps the prompt blocks it served
(block hashes chained over the prefix, LRU, bounded in tokens); a request whose leading blocks
it holds skips their prefill, and /sim/stats says how many tokens were computed and skipped."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tidegate.sim.app import create_sim_app
from tidegate.sim.prefix_cache import BYTES_PER_TOKEN, PrefixCache
from tidegate.sim.profile import Kind, SimProfile

BLOCK = 16
BLOCK_BYTES = BLOCK * BYTES_PER_TOKEN


def prompt(*parts: bytes) -> bytes:
    return b"".join(parts)


def test_a_repeated_prefix_is_found_block_by_block():
    cache = PrefixCache(capacity_tokens=10_000, block_tokens=BLOCK)
    system = b"s" * (BLOCK_BYTES * 4)
    assert cache.cached_tokens(prompt(system, b"q" * BLOCK_BYTES), 80) == 0  # first sight
    assert cache.cached_tokens(prompt(system, b"r" * BLOCK_BYTES), 80) == 4 * BLOCK  # the system prompt
    assert cache.cached_tokens(prompt(b"x" * BLOCK_BYTES, system), 80) == 0  # a prefix, not a substring


def test_a_hit_never_covers_the_whole_prompt():
    cache = PrefixCache(capacity_tokens=10_000, block_tokens=BLOCK)
    same = b"a" * (BLOCK_BYTES * 2)
    cache.cached_tokens(same, 2 * BLOCK)
    assert cache.cached_tokens(same, 2 * BLOCK) == 2 * BLOCK - 1  # the last token is computed


def test_the_cache_is_bounded_and_forgets_the_least_recent():
    cache = PrefixCache(capacity_tokens=4 * BLOCK, block_tokens=BLOCK)
    a, b = b"a" * (BLOCK_BYTES * 3), b"b" * (BLOCK_BYTES * 3)
    cache.cached_tokens(a, 1000)
    cache.cached_tokens(b, 1000)  # 6 blocks offered, 4 kept: a's first two are gone
    assert len(cache) == 4
    assert cache.cached_tokens(a, 1000) == 0
    assert cache.cached_tokens(b, 1000) == 0  # a's blocks pushed b's oldest out in turn


def test_no_capacity_is_no_cache():
    cache = PrefixCache(capacity_tokens=0)
    cache.cached_tokens(b"a" * 1000, 250)
    assert (len(cache), cache.cached_tokens(b"a" * 1000, 250)) == (0, 0)
    with pytest.raises(ValueError, match="capacity_tokens"):
        PrefixCache(capacity_tokens=-1)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_sim_skips_the_prefill_of_a_cached_prefix_and_reports_it(stream):
    profile = SimProfile(kind=Kind.DEDICATED, name="d", prefix_cache_tokens=100_000, time_scale=100.0, seed=1)
    app = create_sim_app(profile)
    system = {"role": "system", "content": "You are a careful assistant. " * 40}
    sent = []
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        for question in ("first?", "second?"):
            messages = [system, {"role": "user", "content": question}]
            sent.append(len(orjson.dumps(messages)) // BYTES_PER_TOKEN)  # the sim's own count
            body = {"model": "d", "messages": messages, "stream": stream}
            answer = await client.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200
        stats = (await client.get("/sim/stats")).json()
    system_tokens = len(orjson.dumps([system])) // BYTES_PER_TOKEN
    assert stats["prefix_hit_tokens"] >= system_tokens - 2 * BLOCK  # the second one's system prompt
    assert stats["prefix_hit_tokens"] < sent[1]  # the question itself was computed
    assert stats["prefill_tokens"] + stats["prefix_hit_tokens"] == sum(sent)


async def test_without_a_prefix_cache_every_prompt_token_is_computed():
    app = create_sim_app(SimProfile(kind=Kind.DEDICATED, name="d", time_scale=100.0, seed=1))
    body = {"model": "d", "messages": [{"role": "user", "content": "same question " * 50}]}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
        for _ in range(2):
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        stats = (await client.get("/sim/stats")).json()
    assert stats["prefix_hit_tokens"] == 0
    assert stats["prefill_tokens"] == 2 * (len(orjson.dumps(body["messages"])) // BYTES_PER_TOKEN)


async def test_replayed_mooncake_rows_that_share_blocks_hit_the_cache():
    """`tidegate replay` writes a Mooncake row's prompt from its hash_ids: the sim then finds the
    blocks two rows share (here 2 of 3, 512 tokens each) in its prefix cache."""
    from tidegate.cli.replay import prompt  # noqa: PLC0415

    app = create_sim_app(
        SimProfile(kind=Kind.DEDICATED, name="d", prefix_cache_tokens=100_000, time_scale=100.0)
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
        for index, blocks in enumerate(((0, 1, 2), (0, 1, 3))):
            body = {"model": "d", "messages": [{"role": "user", "content": prompt(index, 1500, blocks)}]}
            answer = await client.post(
                "/v1/chat/completions", json=body, headers={"x-sim-prompt-tokens": "1500"}
            )
            assert answer.status_code == 200
        stats = (await client.get("/sim/stats")).json()
    assert 2 * 512 - BLOCK <= stats["prefix_hit_tokens"] <= 2 * 512 + BLOCK
    assert stats["prefill_tokens"] == 2 * 1500 - stats["prefix_hit_tokens"]
