"""A dedicated pool declared in one entry (`replica_urls`) loads as one endpoint per replica
(router/config/pools.py); what would be ambiguous is refused, naming the key."""

from __future__ import annotations

import pytest

from router.config import ConfigError, parse_config

HEAD = "auth: {allow_anonymous: true}\nmodels:\n  m:\n    dedicated:\n"


def load(entry: str, extra: str = ""):
    return parse_config(HEAD + entry + extra, {})


def test_a_pool_entry_is_one_endpoint_per_replica_with_its_own_slots_and_metrics():
    config = load(
        "      - {name: vllm, model: d, gpu_hour_usd: 2.0, max_concurrency: 8,\n"
        "         replica_urls: ['http://10.0.0.5:8000/v1', 'http://10.0.0.6:8000/v1'],\n"
        "         engine_signal: {metrics_url: 'http://anything/metrics'}}\n"
    )
    replicas = config.models["m"].dedicated
    assert [r.name for r in replicas] == ["vllm-0", "vllm-1"]
    assert [r.base_url for r in replicas] == ["http://10.0.0.5:8000/v1", "http://10.0.0.6:8000/v1"]
    assert [r.max_concurrency for r in replicas] == [8, 8]  # each replica's: 16 in all
    assert [r.engine_signal.metrics_url for r in replicas if r.engine_signal] == [
        "http://10.0.0.5:8000/metrics",
        "http://10.0.0.6:8000/metrics",
    ]
    assert all(r.replicas == 1 and not r.replica_urls for r in replicas)
    assert sum(r.usd_per_hour for r in replicas) == pytest.approx(4.0)  # priced per replica


def test_a_config_without_pools_loads_as_written():
    config = load("      - {name: one, model: d, gpu_hour_usd: 0, max_concurrency: 2, base_url: 'http://a:1/v1'}\n")
    assert [d.name for d in config.models["m"].dedicated] == ["one"]


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ("base_url: 'http://a:1/v1', replica_urls: ['http://b:1/v1']", "leave base_url out"),
        ("replicas: 3, replica_urls: ['http://b:1/v1']", "leave replicas out"),
        ("replica_urls: ['http://b:1/v1', 'http://b:1/v1']", "listed twice"),
        ("replica_urls: ['http://b:1']", "no API path"),
        ("replica_urls: ['ftp://b/v1']", "replica_urls[0]"),
    ],
)
def test_an_ambiguous_or_bad_pool_is_refused_naming_the_key(entry, said):
    with pytest.raises(ConfigError, match=r"models\.m\.dedicated") as caught:
        load(f"      - {{name: vllm, model: d, gpu_hour_usd: 0, max_concurrency: 2, {entry}}}\n")
    assert said in str(caught.value)


def test_a_replica_name_clashing_with_another_endpoint_is_refused():
    with pytest.raises(ConfigError, match="'vllm-1' is used twice"):
        load(
            "      - {name: vllm, model: d, gpu_hour_usd: 0, max_concurrency: 2,"
            " replica_urls: ['http://a:1/v1', 'http://b:1/v1']}\n"
            "      - {name: vllm-1, model: d, gpu_hour_usd: 0, max_concurrency: 2, base_url: 'http://c:1/v1'}\n"
        )
