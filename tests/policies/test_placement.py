"""Placement among a model's dedicated replicas (issue 38): load, prefix and session affinity,
the plain orders, and why each request went where it did."""

from __future__ import annotations

import pytest

from policies import registry
from policies.base import Placed, Reason, RequestContext
from policies.placement import Placement, Placer, Weights, load_per_slot
from policies.types import EngineQueue, Snapshot
from router.config import DedicatedEndpoint, ModelConfig, PlacementConfig, RoutingConfig, ServerlessEndpoint

REPLICAS = tuple(
    DedicatedEndpoint(gpu_hour_usd=0, name=f"vllm-{i}", base_url=f"http://v{i}/v1", model="x", max_concurrency=10)
    for i in range(4)
)
S1 = ServerlessEndpoint(usd_per_mtok_in=0, usd_per_mtok_out=0, name="s1", base_url="http://s1/v1", model="x")
CANDIDATES = (*REPLICAS, S1)


def policy(mode: Placement = Placement.SCORED, **weights: float) -> registry.Policy:
    placement = PlacementConfig(mode=mode, **{f"{k}_weight": v for k, v in weights.items()})
    model = ModelConfig(routing=RoutingConfig(placement=placement), dedicated=REPLICAS, serverless=(S1,))
    return registry.build("dedicated_first", model)


def ctx(key: str = "user-1", **kw: object) -> RequestContext:
    return RequestContext("m", stream=False, stickiness_key=key, **kw)  # type: ignore[arg-type]


def names(targets: tuple[object, ...]) -> list[str]:
    return [t.name for t in targets]  # type: ignore[attr-defined]


def test_the_least_loaded_replica_is_first_and_serverless_stays_last():
    snapshot = Snapshot(now=0, in_flight={"vllm-0": 6, "vllm-1": 2, "vllm-2": 9, "vllm-3": 4})
    decision = policy().decide(ctx(), snapshot, CANDIDATES)
    assert names(decision.targets) == ["vllm-1", "vllm-3", "vllm-0", "vllm-2", "s1"]
    assert decision.reason is Reason.BASELINE
    assert decision.placement is Placed.LEAST_LOADED


def test_the_engines_own_queue_and_the_line_count_as_load():
    snapshot = Snapshot(
        now=0,
        in_flight={"vllm-0": 1, "vllm-1": 1, "vllm-2": 1, "vllm-3": 1},
        waiting={"vllm-0": 3},
        engine_queue={"vllm-1": EngineQueue(waiting=5.0), "vllm-2": EngineQueue(waiting=1.0)},
    )
    assert load_per_slot(snapshot, REPLICAS[1]) == pytest.approx(0.6)
    decision = policy().decide(ctx(), snapshot, CANDIDATES)
    assert names(decision.targets)[:4] == ["vllm-3", "vllm-2", "vllm-0", "vllm-1"]


def test_a_prefix_wins_its_replica_unless_that_replica_is_much_busier():
    hits = {"vllm-2": 1.0}
    # a cached prompt saves its whole prefill: 0.3 per slot and half a prompt ahead cost less
    a_little_busier = Snapshot(now=0, in_flight={"vllm-2": 3}, pending_prompt_tokens={"vllm-2": 500})
    decision = policy().decide(ctx(prefix_hits=hits, prompt_tokens=1000), a_little_busier, CANDIDATES)
    assert names(decision.targets)[0] == "vllm-2"
    assert decision.placement is Placed.PREFIX_AFFINITY
    # two prompts' worth of prefill ahead of it: starting elsewhere is sooner, cache or not
    much_busier = Snapshot(now=0, in_flight={"vllm-2": 3}, pending_prompt_tokens={"vllm-2": 2000})
    decision = policy().decide(ctx(prefix_hits=hits, prompt_tokens=1000), much_busier, CANDIDATES)
    assert names(decision.targets)[0] != "vllm-2"
    assert decision.placement is Placed.LEAST_LOADED
    many_slots_busy = Snapshot(now=0, in_flight={"vllm-2": 8}, pending_prompt_tokens={"vllm-2": 3000})
    decision = policy().decide(ctx(prefix_hits=hits, prompt_tokens=1000), many_slots_busy, CANDIDATES)
    assert names(decision.targets)[0] != "vllm-2"


def test_the_prefill_waiting_on_a_replica_counts_in_tokens_not_requests():
    snapshot = Snapshot(
        now=0,
        in_flight={f"vllm-{i}": 2 for i in range(4)},
        pending_prompt_tokens={"vllm-0": 6000, "vllm-1": 500, "vllm-2": 2000, "vllm-3": 1000},
    )
    decision = policy().decide(ctx(prompt_tokens=1000), snapshot, CANDIDATES)
    assert names(decision.targets)[:4] == ["vllm-1", "vllm-3", "vllm-2", "vllm-0"]
    # least_loaded counts requests only: the queues of tokens do not move it
    counted = policy(Placement.LEAST_LOADED).decide(ctx(prompt_tokens=1000), snapshot, CANDIDATES)
    uncounted = Snapshot(now=0, in_flight=dict(snapshot.in_flight))
    assert counted.targets == policy(Placement.LEAST_LOADED).decide(ctx(prompt_tokens=1000), uncounted, CANDIDATES).targets


    # a longer shared prefix beats a shorter one on equal load
    decision = policy().decide(ctx(prefix_hits={"vllm-0": 0.25, "vllm-3": 0.75}), Snapshot(now=0), CANDIDATES)
    assert names(decision.targets)[:2] == ["vllm-3", "vllm-0"]


def test_a_full_replica_is_skipped_and_the_next_best_is_said_for_itself():
    snapshot = Snapshot(now=0, in_flight={"vllm-2": 10, "vllm-0": 1, "vllm-1": 1, "vllm-3": 1})
    decision = policy().decide(ctx(prefix_hits={"vllm-2": 1.0, "vllm-3": 0.5}), snapshot, CANDIDATES)
    assert names(decision.targets)[0] == "vllm-3"  # vllm-2 holds more of it but has no slot
    assert decision.placement is Placed.PREFIX_AFFINITY
    assert decision.reason is Reason.BASELINE


def test_the_whole_pool_full_is_saturated():
    snapshot = Snapshot(now=0, in_flight={r.name: 10 for r in REPLICAS})
    decision = policy().decide(ctx(), snapshot, CANDIDATES)
    assert names(decision.targets) == ["s1"]
    assert decision.reason is Reason.SATURATED
    assert decision.placement is None  # no dedicated replica was placed


def test_a_session_has_one_home_every_gateway_agrees_on_and_which_moves_only_when_it_leaves():
    homes = {}
    for i in range(200):
        decision = policy().decide(ctx(session=f"s-{i}"), Snapshot(now=0), CANDIDATES)
        again = Placer().place(ctx(key="another", session=f"s-{i}"), Snapshot(now=0), CANDIDATES)[0]
        assert names(decision.targets)[0] == names(again)[0]  # another process, another key: same home
        assert decision.placement is Placed.SESSION_AFFINITY
        homes[f"s-{i}"] = names(decision.targets)[0]
    assert set(homes.values()) == {r.name for r in REPLICAS}  # sessions spread over the pool
    three = tuple(r for r in CANDIDATES if r.name != "vllm-3")
    for session, home in homes.items():
        moved = names(Placer().place(ctx(session=session), Snapshot(now=0), three)[0])[0]
        if home != "vllm-3":
            assert moved == home  # only vllm-3's sessions move when it leaves
    # a session's home is left when it is much busier (0.5 per slot over a 0.3 bonus)
    home = homes["s-0"]
    busy = Snapshot(now=0, in_flight={home: 5})
    assert names(policy().decide(ctx(session="s-0"), busy, CANDIDATES).targets)[0] != home


def test_requests_without_affinity_spread_over_the_pool_on_even_load():
    firsts = {names(policy().decide(ctx(key=f"k{i}"), Snapshot(now=0), CANDIDATES).targets)[0] for i in range(100)}
    assert firsts == {r.name for r in REPLICAS}


@pytest.mark.parametrize(
    ("mode", "why"),
    [(Placement.LISTED, Placed.LISTED), (Placement.ROUND_ROBIN, Placed.ROUND_ROBIN)],
)
def test_the_plain_orders(mode, why):
    chosen = policy(mode)
    snapshot = Snapshot(now=0, in_flight={"vllm-0": 9})
    firsts = [names(chosen.decide(ctx(), snapshot, CANDIDATES).targets)[0] for _ in range(8)]
    if mode is Placement.LISTED:
        assert firsts == ["vllm-0"] * 8  # the first with room, busy or not
    else:
        assert firsts == ["vllm-0", "vllm-1", "vllm-2", "vllm-3"] * 2
    assert chosen.decide(ctx(), snapshot, CANDIDATES).placement is why


def test_one_replica_has_no_placement():
    decision = Placer().place(ctx(), Snapshot(now=0), (REPLICAS[0], S1))
    assert decision == ((REPLICAS[0], S1), {})


def test_weights_of_zero_leave_load_alone_to_decide():
    placer = Placer(Placement.SCORED, Weights(load=1.0, prefix=0.0, session=0.0))
    snapshot = Snapshot(now=0, in_flight={"vllm-0": 0, "vllm-1": 5, "vllm-2": 5, "vllm-3": 5})
    ordered, whys = placer.place(ctx(session="s", prefix_hits={"vllm-1": 1.0}), snapshot, CANDIDATES)
    assert names(ordered)[0] == "vllm-0" and whys["vllm-0"] is Placed.LEAST_LOADED


def test_a_first_seen_prompt_goes_to_one_replica_whatever_the_random_key_and_prompts_spread():
    def first(**kw: object) -> str:
        return names(policy().decide(ctx(**kw), Snapshot(now=0), CANDIDATES).targets)[0]

    # the same prompt (its first block) from many anonymous clients: one replica, on every gateway
    assert len({first(key=f"random-{i}", placement_key="prefix:00ab") for i in range(16)}) == 1
    # different prompts spread over the pool
    assert len({first(key="same", placement_key=f"prefix:{i:04x}") for i in range(32)}) == 4
    # a session still decides before the prompt
    assert first(session="s-1", placement_key="prefix:00ab") == first(session="s-1", placement_key="prefix:ffff")


def test_a_full_replica_is_never_first_while_another_has_a_slot():
    # vllm-0: every slot held, all decoding (nothing pending); vllm-1: one prompt in prefill
    snapshot = Snapshot(
        now=0,
        in_flight={"vllm-0": 10, "vllm-1": 1, "vllm-2": 10, "vllm-3": 10},
        pending_prompt_tokens={"vllm-1": 4000},
    )
    decision = policy().decide(ctx(prompt_tokens=1000, prefix_hits={"vllm-0": 1.0}), snapshot, CANDIDATES)
    assert names(decision.targets)[0] == "vllm-1"  # the first target is where a request waits in line
