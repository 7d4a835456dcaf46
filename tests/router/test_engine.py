"""The shared-step engine (router/engine): hand-worked steps, the KV cache, preemption, runs cut
by arrivals, and properties over random traffic (every sequence ends, no KV leaks)."""

from __future__ import annotations

import math
import random

import pytest

from router.engine.drive import Job, replay
from router.engine.replica import Replica
from router.engine.spec import EngineSpec

SPEC = EngineSpec(step_fixed_s=0.010, step_per_seq_s=0.001, step_per_prompt_token_s=0.0001)


def _run(replica: Replica, until: float = math.inf) -> list[tuple[float, str, int]]:
    seen: list[tuple[float, str, int]] = []
    while replica.step_end_at < math.inf and replica.step_end_at <= until:
        at = replica.step_end_at
        replica.end_step(at)
        seen.extend((at, kind, key) for kind, key in replica.drain())
    return seen


def test_a_step_costs_its_fixed_part_its_decoders_and_its_prompt_tokens():
    assert SPEC.step_s(0, 1000) == pytest.approx(0.010 + 0.1)
    assert SPEC.step_s(20) == pytest.approx(0.030)
    assert SPEC.step_s(20, 500) == pytest.approx(0.080)  # a chunk slows every decoder beside it
    ceiling = EngineSpec(0.010, 0.0, 0.0001, decode_tokens_per_s=100.0)
    assert ceiling.step_s(10) == pytest.approx(0.1)  # 100 tokens/s shared by 10


def test_capacity_adds_prefill_and_decode_seconds_rather_than_taking_the_tighter():
    spec = EngineSpec(0.010, 0.0001, 1 / 10_000, max_num_seqs=100)
    per_task = 1000 / 10_000 + 100 * (0.010 + 0.0001 * 100) / 100
    assert spec.tasks_per_hour(1000, 100) == pytest.approx(3600 / per_task)
    prefill_tasks, decode_tasks = 10_000 / 1000, (100 / 0.020) / 100  # 10 and 50 a second
    assert spec.tasks_per_hour(1000, 100) == pytest.approx(3600 / (1 / prefill_tasks + 1 / decode_tasks))
    assert spec.tasks_per_hour(1000, 100) < 0.85 * min(prefill_tasks, decode_tasks) * 3600  # the old min


def test_the_kv_cache_bounds_the_batch_a_full_replica_runs():
    spec = EngineSpec(0.010, 0.0001, 1e-4, max_num_seqs=1024, kv_capacity_tokens=110_000)
    assert spec.concurrency(1000, 200) == 100
    assert EngineSpec(0.010, 0.0001, 1e-4, max_num_seqs=64).concurrency(1000, 200) == 64


def test_a_lone_request_is_chunked_then_decodes_one_token_a_step():
    spec = EngineSpec(0.010, 0.001, 0.0001, max_num_batched_tokens=1000)
    replica = Replica(spec)
    replica.submit(0.0, 7, 2500, 4)
    events = _run(replica)
    first = next(at for at, kind, _ in events if kind == "first")
    done = next(at for at, kind, _ in events if kind == "done")
    assert first == pytest.approx(3 * 0.010 + 2500 * 0.0001)  # 1,000 + 1,000 + 500
    assert done == pytest.approx(first + 3 * 0.011)  # three more tokens, one decoder each step
    assert (replica.running, replica.kv_used) == (0, 0)


def test_an_arrival_cuts_a_run_of_decode_steps_and_joins_the_next_step():
    replica = Replica(SPEC)
    replica.submit(0.0, 1, 100, 1000)
    _run(replica, until=0.02)  # prefilled at 0.02; a long run of decode steps of 11 ms follows
    assert replica.step_end_at == pytest.approx(0.02 + 999 * 0.011)
    replica.submit(0.05, 2, 100, 2)
    assert replica.step_end_at == pytest.approx(0.02 + 3 * 0.011)  # the step in progress ends
    events = _run(replica)
    first = next(at for at, kind, key in events if kind == "first" and key == 2)
    assert first == pytest.approx(0.02 + 3 * 0.011 + 0.010 + 0.001 + 100 * 0.0001)


def test_at_most_max_num_seqs_run_and_the_rest_wait_in_order():
    spec = EngineSpec(0.010, 0.001, 0.0001, max_num_seqs=2)
    replica = Replica(spec)
    for key in range(4):
        replica.submit(0.0, key, 10, 5)
    assert (replica.running, replica.waiting) == (1, 3)  # an idle replica starts a step at once
    admitted = [key for kind, key in replica.drain() if kind == "admitted"]
    most = 0
    while replica.step_end_at < math.inf:
        replica.end_step(replica.step_end_at)
        most = max(most, replica.running)
        admitted += [key for kind, key in replica.drain() if kind == "admitted"]
    assert admitted == [0, 1, 2, 3] and most == 2


def test_a_full_kv_cache_preempts_the_newest_which_recomputes_and_still_finishes():
    spec = EngineSpec(0.010, 0.001, 0.0001, kv_capacity_tokens=260)
    replica = Replica(spec)
    replica.submit(0.0, 1, 100, 100)
    replica.submit(0.0, 2, 100, 100)
    events = _run(replica)
    assert replica.preemptions >= 1
    assert sorted(key for _, kind, key in events if kind == "done") == [1, 2]
    assert [key for _, kind, key in events if kind == "first"].count(2) == 1  # its first token once
    assert replica.kv_used == 0


def test_a_watch_fires_when_the_sequence_has_produced_that_many_tokens():
    replica = Replica(SPEC)
    replica.submit(0.0, 1, 100)  # no output bound: it runs until released
    _run(replica, until=0.02)
    replica.watch(0.02, 1, 11)
    events = _run(replica, until=1.0)
    assert [(kind, key) for _, kind, key in events] == [("token", 1)]
    assert events[0][0] == pytest.approx(0.02 + 10 * 0.011)
    replica.release(events[0][0], 1)
    assert (replica.running, replica.kv_used, replica.step_end_at) == (0, 0, math.inf)


@pytest.mark.parametrize("seed", range(6))
def test_every_sequence_ends_once_and_the_cache_is_empty_after_random_traffic(seed):
    rng = random.Random(seed)
    spec = EngineSpec(
        0.005,
        0.0002,
        0.00005,
        max_num_seqs=rng.choice([4, 32, 1024]),
        max_num_batched_tokens=rng.choice([512, 8192]),
        kv_capacity_tokens=rng.choice([3000, 50_000, math.inf]),
    )
    jobs = [Job(rng.randint(1, 2000), rng.randint(1, 300), rng.uniform(0, 20)) for _ in range(300)]
    timings = replay(spec, jobs)
    for job, t in zip(jobs, timings, strict=True):
        assert job.at_s <= t.first_s <= t.done_s, (job, t)


def test_released_sequences_free_their_slot_and_cache_wherever_they_are():
    spec = EngineSpec(0.010, 0.001, 0.0001, max_num_seqs=1, max_num_batched_tokens=100)
    replica = Replica(spec)
    replica.submit(0.0, 1, 1000, 50)  # prefilling in chunks of 100
    replica.submit(0.0, 2, 10, 5)  # waiting for the one slot
    replica.release(0.0, 2)
    _run(replica, until=0.05)
    replica.release(0.05, 1)
    assert (replica.running, replica.waiting, replica.kv_used) == (0, 0, 0)
