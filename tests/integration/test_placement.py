"""Placement over real simulator processes (issue 38): the official SDK -> `tidegate serve` ->
two `tidegate sim` replicas with prefix caches. The same long prefix stays on one replica (and
its cache serves it); different prefixes and concurrent load use both; overflow between
replicas is no spill."""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections import Counter
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.servers import CliProcess

PREFIXES = [f"System prompt {i}: you answer questions about tide table number {i}. " * 60 for i in range(6)]


def sims(count: int, slots: int) -> list[CliProcess]:
    return [
        CliProcess(
            "sim", "--profile", "dedicated", "--port", "0", "--name", f"vllm-{i}", "--max-concurrency",
            str(slots), "--time-scale", "50", "--prefix-cache-tokens", "200000",
        )
        for i in range(count)
    ]


def config_for(tmp_path, replicas: list[CliProcess], slots: int, mode: str = "scored", pool: bool = False) -> str:
    """One entry per replica, or (`pool`) one entry listing them all: both load as vllm-0, vllm-1."""
    entries = ", ".join(
        f"{{name: vllm-{i}, gpu_hour_usd: 0, base_url: '{r.url}', model: d, max_concurrency: {slots}}}"
        for i, r in enumerate(replicas)
    )
    if pool:
        urls = ", ".join(f"'{r.url}'" for r in replicas)
        entries = f"{{name: vllm, gpu_hour_usd: 0, replica_urls: [{urls}], model: d, max_concurrency: {slots}}}"
    path = tmp_path / "tidegate.yaml"
    path.write_text(
        "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
        f"    routing: {{placement: {{mode: {mode}}}}}\n"
        f"    dedicated: [{entries}]\n"
    )
    return str(path)


@contextlib.contextmanager
def two_replicas(slots: int) -> Iterator[tuple[CliProcess, CliProcess]]:
    first, second = sims(2, slots)
    with first as r0, second as r1:
        yield r0, r1


@contextlib.contextmanager
def gateway_over(
    tmp_path, replicas: list[CliProcess], slots: int, pool: bool = False
) -> Iterator[openai.OpenAI]:
    """`tidegate serve` in front of the replicas, and an SDK client of it."""
    config = config_for(tmp_path, replicas, slots, pool=pool)
    with CliProcess("serve", "--config", config, "--port", "0") as gw:
        yield openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0)


def ask(client: openai.OpenAI, system: str, question: str, **headers: str) -> dict[str, str]:
    raw = client.chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=2,
        extra_headers=headers,
    )
    raw.parse()
    return dict(raw.headers)


@pytest.mark.timeout(120)
def test_a_prefix_stays_on_its_replica_whose_cache_then_serves_it(tmp_path):
    with two_replicas(8) as (r0, r1):
        with gateway_over(tmp_path, [r0, r1], 8) as client:
            homes: dict[int, set[str]] = {}
            whys: Counter[str] = Counter()
            for turn in range(4):  # one at a time: load never outweighs the prefix
                for p, prefix in enumerate(PREFIXES):
                    headers = ask(client, prefix, f"question {turn}")
                    homes.setdefault(p, set()).add(headers["x-tidegate-route"])
                    if turn:
                        whys[headers["x-tidegate-placement"]] += 1
                    assert headers["x-tidegate-reason"] == "baseline"
            assert all(len(h) == 1 for h in homes.values()), homes  # each prefix on one replica
            assert {next(iter(h)) for h in homes.values()} == {"vllm-0", "vllm-1"}  # and both used
            assert whys == {"prefix_affinity": 3 * len(PREFIXES)}
        stats = [httpx.get(r.root + "/sim/stats").json() for r in (r0, r1)]
    assert sum(s["completed"] for s in stats) == 4 * len(PREFIXES)
    # after each prefix's first request, its replica's cache held it: most prompt tokens were hits
    hit = sum(s["prefix_hit_tokens"] for s in stats)
    computed = sum(s["prefill_tokens"] for s in stats)
    assert hit > 2 * computed, stats


@pytest.mark.timeout(120)
def test_concurrent_load_uses_every_replica_and_overflow_between_them_is_no_spill(tmp_path):
    with two_replicas(4) as (r0, r1):
        with gateway_over(tmp_path, [r0, r1], 4, pool=True) as client:  # declared as one pool entry
            with concurrent.futures.ThreadPoolExecutor(8) as pool:  # 8 at once on 2 x 4 slots
                answers = list(pool.map(lambda i: ask(client, PREFIXES[0], f"q{i}"), range(24)))
            routes = Counter(a["x-tidegate-route"] for a in answers)
            assert set(routes) == {"vllm-0", "vllm-1"}, routes  # one shared prefix, yet both replicas
            assert {a["x-tidegate-reason"] for a in answers} == {"baseline"}  # never `saturated`
            assert {a["x-tidegate-placement"] for a in answers} <= {"prefix_affinity", "least_loaded", "overflow"}
        stats = [httpx.get(r.root + "/sim/stats").json() for r in (r0, r1)]
    assert sum(s["completed"] for s in stats) == 24
    assert all(s["completed"] > 0 for s in stats)
