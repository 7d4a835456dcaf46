"""The prompt-prefix blocks and the per-process index placement reads (router/request/placement.py),
and the walk's `saturated` meaning the whole pool (issue 38)."""

from __future__ import annotations

import orjson

from policies.base import Placed, Reason
from router.config import DedicatedEndpoint, ModelConfig, PlacementConfig, RoutingConfig, ServerlessEndpoint
from router.openai import peek
from router.record.records import Attempt
from router.request.asks import asks_of
from router.request.placement import PrefixIndex, counts_pending, prompt_blocks, session_of, tie_key
from router.request.walk import Walk, tidegate_headers

SYSTEM = "You are a careful assistant for the tide tables of the northern coast. " * 40  # ~2.9 KB


def body(*messages: str, field: str = "messages") -> bytes:
    value = [{"role": "user", "content": m} for m in messages] if field == "messages" else messages[0]
    return orjson.dumps({"model": "m", field: value})


def blocks(raw: bytes, size: int = 512, most: int = 128) -> tuple[int, ...]:
    return prompt_blocks(peek(raw).body, size, most)


def test_shared_prefixes_share_leading_blocks_and_nothing_after_the_first_difference():
    a = blocks(body(SYSTEM, "what is high tide at Wick?"))
    b = blocks(body(SYSTEM, "and at Thurso?"))
    other = blocks(body("Another system prompt. " + SYSTEM))
    assert len(a) >= 5 and a[:5] == b[:5]
    assert not set(a) & set(other)  # chained: a different first block changes every block
    assert blocks(body("short")) == ()  # no whole block
    assert len(blocks(body(SYSTEM * 10), most=7)) == 7
    assert blocks(body(SYSTEM, field="prompt"))[:3] == blocks(body(SYSTEM, field="input"))[:3]
    assert blocks(orjson.dumps({"model": "m"})) == ()


def test_the_index_counts_the_leading_blocks_a_replica_holds_and_forgets_the_oldest():
    index = PrefixIndex(capacity=8)
    first = blocks(body(SYSTEM, "one"))[:4]
    index.served("m", "vllm-0", first)
    assert index.shares("m", first, ["vllm-0", "vllm-1"]) == {"vllm-0": 1.0}
    longer = (*first, 11, 12, 13, 14)
    assert index.shares("m", longer, ["vllm-0"]) == {"vllm-0": 0.5}
    assert index.shares("m", (99, *first), ["vllm-0"]) == {}  # a miss ends the prefix
    assert index.shares("other-model", first, ["vllm-0"]) == {}
    index.served("m", "vllm-0", tuple(range(100, 108)))  # 8 newer blocks: the first ones are evicted
    assert index.shares("m", first, ["vllm-0"]) == {}
    index.forget("m", "vllm-0")
    assert index.shares("m", tuple(range(100, 108)), ["vllm-0"]) == {}
    off = PrefixIndex(capacity=0)
    off.served("m", "vllm-0", first)
    assert off.shares("m", first, ["vllm-0"]) == {}


def test_the_session_is_the_header_else_the_task():
    assert session_of(asks_of([(b"x-tidegate-session", b"abc")]).session, "t:task") == "abc"
    assert session_of(asks_of([(b"other", b"x")]).session, "t:task") == "t:task"
    assert session_of(asks_of([]).session, None) is None


D0, D1 = (
    DedicatedEndpoint(gpu_hour_usd=0, name=f"vllm-{i}", base_url=f"http://v{i}/v1", model="x", max_concurrency=1)
    for i in range(2)
)
SL = ServerlessEndpoint(usd_per_mtok_in=0, usd_per_mtok_out=0, name="sl", base_url="http://s/v1", model="x")


def test_a_full_replica_passed_for_another_of_the_pool_is_no_spill():
    walk = Walk((D0, D1, SL), Reason.BASELINE, placement=Placed.PREFIX_AFFINITY)
    walk.saturated()  # vllm-0 had no room
    walk.begin(D1, 1)
    assert walk.reason is Reason.BASELINE
    assert tidegate_headers(walk)["x-tidegate-placement"] == "overflow"


def test_a_request_that_leaves_the_pool_for_want_of_room_is_saturated():
    walk = Walk((D0, D1, SL), Reason.BASELINE, placement=Placed.LEAST_LOADED)
    walk.saturated()
    walk.saturated()
    walk.begin(SL, 2)
    assert walk.reason is Reason.SATURATED
    assert "x-tidegate-placement" not in tidegate_headers(walk)
    alone = Walk((D0, D1), Reason.BASELINE)
    alone.saturated()
    alone.saturated()
    alone.pool_full()
    assert alone.reason is Reason.SATURATED


def test_a_failover_stays_a_failover():
    walk = Walk((D0, SL), Reason.BASELINE, placement=Placed.LEAST_LOADED)
    walk.begin(D0, 0)
    assert tidegate_headers(walk)["x-tidegate-placement"] == "least_loaded"
    walk.failed(Attempt("vllm-0", "ConnectError", 1.0))
    walk.saturated()
    walk.begin(SL, 0)
    assert walk.reason is Reason.FAILOVER


def test_a_pool_placed_by_score_counts_each_replicas_pending_prefill_and_one_replica_does_not():
    def model(replicas: int, mode: str = "scored", admission: str = "slots") -> ModelConfig:
        dedicated = tuple(
            DedicatedEndpoint(gpu_hour_usd=0, name=f"v-{i}", base_url=f"http://v{i}/v1", model="x", max_concurrency=4)
            for i in range(replicas)
        )
        routing = RoutingConfig(placement=PlacementConfig(mode=mode), admission=admission)
        return ModelConfig(routing=routing, dedicated=dedicated)

    assert counts_pending(model(2))  # scored reads the prefill waiting per replica
    assert not counts_pending(model(1))  # nothing to place: no count, no extra store work
    assert not counts_pending(model(3, mode="round_robin"))
    assert counts_pending(model(1, admission="predicted_ttft"))  # admission reads it anyway


def test_the_tie_key_is_the_user_else_the_prompts_first_block_else_none():
    first = blocks(body(SYSTEM, "what is high tide at Wick?"))
    assert tie_key("alice", first) == "alice"
    assert tie_key(None, first) == tie_key(None, blocks(body(SYSTEM, "and at Thurso?")))  # same system prompt
    assert tie_key(None, first) != tie_key(None, blocks(body("Another system prompt. " + SYSTEM)))
    assert tie_key(None, ()) is None  # no whole block: the random stickiness key decides
