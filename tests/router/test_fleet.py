"""Pools found by DNS (router/fleet/): the config that declares them, and the live endpoint
list against a real DNS server on loopback (tests/nameserver.py) and the memory store. A
replica that resolves is served; one that stops resolving takes no new request but keeps its
slot set while it holds a lease; a freed slot set goes to the next new replica, and the
placer forgets what it believed that slot set's cache held."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from router.app import create_app
from router.config import ConfigError, parse_config
from router.economics.costs import dns_pool_gauges
from router.fleet.membership import Fleet
from router.signals.loop import Signals
from router.state.memory.store import MemoryStore
from router.state.slots import Slots
from tests.conftest import dedicated_profile
from tests.nameserver import Nameserver
from tests.servers import Sim, ThreadServer

POOL = "{name: vllm, model: d, gpu_hour_usd: 0, max_concurrency: 2, replica_dns: 'http://vllm.test:8000/v1', max_replicas: 3}"


def config_text(nameserver: str, pool: str = POOL, discovery: str = "refresh_s: 0.1, forget_after_s: 1") -> str:
    return (
        "auth: {allow_anonymous: true}\n"
        f"discovery: {{{discovery}, nameservers: ['{nameserver}'], timeout_s: 0.5}}\n"
        "models:\n  m:\n"
        f"    dedicated: [{pool}]\n"
        "    serverless: [{name: sl, model: s, base_url: 'http://sl:1/v1', usd_per_mtok_in: 0, usd_per_mtok_out: 0}]\n"
    )


def test_a_dns_pool_loads_as_max_replicas_slot_sets():
    config = parse_config(config_text("127.0.0.1:53"), {})
    slots = config.models["m"].dedicated
    assert [s.name for s in slots] == ["vllm-0", "vllm-1", "vllm-2"]
    assert all(s.replica_dns == "http://vllm.test:8000/v1" and s.max_concurrency == 2 for s in slots)


@pytest.mark.parametrize(
    ("pool", "said"),
    [
        (POOL.replace("}", ", base_url: 'http://a:1/v1'}"), "leave base_url out"),
        (POOL.replace("}", ", replica_urls: ['http://a:1/v1']}"), "leave replica_urls out"),
        (POOL.replace(", max_replicas: 3", ""), "needs max_replicas"),
        (POOL.replace("replica_dns: 'http://vllm.test:8000/v1'", "base_url: 'http://a:1/v1'"), "bounds a pool"),
        (POOL.replace("8000/v1", "8000"), "no API path"),
    ],
)
def test_an_ambiguous_dns_pool_is_refused_naming_the_key(pool, said):
    with pytest.raises(ConfigError, match=r"models\.m\.dedicated") as caught:
        parse_config(config_text("127.0.0.1:53", pool), {})
    assert said in str(caught.value)


@pytest.mark.parametrize(
    ("discovery", "said"),
    [
        ("refresh_s: 1, forget_after_s: 2", "forget_after_s must be over 3 x refresh_s"),
        ("refresh_s: 0.1, forget_after_s: 1, nameservers: ['dns.local']", "not a name"),
    ],
)
def test_bad_discovery_settings_are_refused(discovery, said):
    text = config_text("127.0.0.1:53", discovery=discovery).replace(", nameservers: ['127.0.0.1:53']", "")
    with pytest.raises(ConfigError, match="discovery") as caught:
        parse_config(text, {})
    assert said in str(caught.value)


def live(fleet: Fleet) -> dict[str, str]:
    return {e.name: e.base_url for e in fleet.endpoints("m")}


async def test_replicas_join_and_leave_and_a_busy_slot_set_is_kept():
    moved: list[tuple[str, str]] = []
    with Nameserver() as ns:
        ns.set("vllm.test", "10.0.0.5")
        config = parse_config(config_text(ns.address), {})
        store = MemoryStore(config.route_keys())
        fleet = Fleet(config, store.members, store.snapshot, on_moved=lambda m, r: moved.append((m, r)))
        await fleet.start()
        try:
            assert live(fleet) == {"vllm-0": "http://10.0.0.5:8000/v1", "sl": "http://sl:1/v1"}
            ns.set("vllm.test", "10.0.0.5", "10.0.0.6")
            await fleet.refresh()
            assert live(fleet)["vllm-1"] == "http://10.0.0.6:8000/v1"

            lease = await store.leases.try_acquire("vllm-0", Slots(capacity=2))  # a request in flight on .5
            assert lease is not None
            ns.set("vllm.test", "10.0.0.6", "10.0.0.7")
            await fleet.refresh()
            assert live(fleet) == {  # .5 takes no new request; .7 finds slot set 0 still held
                "vllm-1": "http://10.0.0.6:8000/v1",
                "vllm-2": "http://10.0.0.7:8000/v1",
                "sl": "http://sl:1/v1",
            }
            started = time.monotonic()
            while time.monotonic() - started < 1.5:  # past forget_after_s: the lease keeps it
                await fleet.refresh()
                assert fleet.members()["vllm"] == {1: "10.0.0.6", 2: "10.0.0.7"}
            assert moved == []

            await store.leases.release(lease)
            ns.set("vllm.test", "10.0.0.6", "10.0.0.7", "10.0.0.8")
            deadline = time.monotonic() + 5
            while "vllm-0" not in live(fleet) and time.monotonic() < deadline:
                await fleet.refresh()
            assert live(fleet)["vllm-0"] == "http://10.0.0.8:8000/v1"  # the freed slot set, reused
            assert moved == [("m", "vllm-0")]
        finally:
            await fleet.close()
            await store.close()


async def test_a_name_with_no_records_is_an_empty_pool_and_a_dead_resolver_refuses_to_start():
    with Nameserver() as ns:
        ns.set("vllm.test")
        config = parse_config(config_text(ns.address), {})
        store = MemoryStore(config.route_keys())
        fleet = Fleet(config, store.members, store.snapshot)
        await fleet.start()
        assert live(fleet) == {"sl": "http://sl:1/v1"}  # scaled to zero: serverless only
        await fleet.close()
    # nothing answers on this port (the nameserver is gone): the start fails, naming the key
    fleet = Fleet(parse_config(config_text(ns.address), {}), store.members, store.snapshot)
    with pytest.raises(ConfigError, match=r"models\.m\.dedicated\[vllm\]\.replica_dns: cannot resolve vllm\.test"):
        await fleet.start()


async def test_a_resolver_that_fails_later_keeps_the_pool_serving():
    ns = Nameserver()
    with ns:
        ns.set("vllm.test", "10.0.0.5")
        config = parse_config(config_text(ns.address), {})
        store = MemoryStore(config.route_keys())
        fleet = Fleet(config, store.members, store.snapshot)
        await fleet.start()
    await fleet.refresh()  # the resolver is gone now
    assert live(fleet)["vllm-0"] == "http://10.0.0.5:8000/v1"
    await fleet.close()


def test_a_request_finding_no_replica_gets_a_503_with_retry_after():
    with Nameserver() as ns:
        ns.set("vllm.test")  # scaled to zero, and no serverless route beside it
        text = config_text(ns.address).replace(
            "    serverless: [{name: sl, model: s, base_url: 'http://sl:1/v1', usd_per_mtok_in: 0, usd_per_mtok_out: 0}]\n",
            "",
        )
        with ThreadServer(create_app(parse_config(text, {}))) as gateway:
            client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
            with pytest.raises(openai.APIStatusError) as caught:
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 503
    assert caught.value.response.headers["retry-after"] == "1"
    assert "no replica now" in caught.value.message


def test_a_dns_pool_reports_the_replicas_its_demand_needs_for_keda():
    config = parse_config(config_text("127.0.0.1:53"), {})  # 3 slot sets of 2 slots
    window = 300.0
    # 2.8 slots busy on average over the window, across two pods: ceil(2.8 / (2 x 0.7)) = 2
    assert dns_pool_gauges(config, {"vllm-0": 1.5 * window, "vllm-1": 1.3 * window}, window) == {
        "vllm": {"desired_replicas": 2.0}
    }
    # more than max_replicas could carry: capped at max_replicas (KEDA's ceiling too)
    assert dns_pool_gauges(config, {"vllm-0": 40 * window}, window) == {"vllm": {"desired_replicas": 3.0}}
    assert dns_pool_gauges(config, {}, window) == {"vllm": {"desired_replicas": 0.0}}


async def test_each_pod_of_a_dns_pool_is_scraped_at_its_own_address():
    with Nameserver() as ns, Sim(dedicated_profile()) as pod:
        ns.set("vllm.test", "127.0.0.1")
        pool = POOL.replace("vllm.test:8000", f"vllm.test:{pod.port}").replace(
            "}", ", engine_signal: {metrics_url: 'http://any/metrics'}}"
        )
        config = parse_config(config_text(ns.address, pool), {})
        store = MemoryStore(config.route_keys())
        fleet = Fleet(config, store.members, store.snapshot)
        signals = Signals(config, store, metrics_url=fleet.metrics_url)
        await fleet.start()
        try:
            assert fleet.metrics_url("vllm-0") == f"http://127.0.0.1:{pod.port}/metrics"
            assert fleet.metrics_url("vllm-1") is None  # no pod on it
            async with httpx.AsyncClient() as client:
                await signals.scrape(client, "vllm-0")
                await signals.scrape(client, "vllm-1")
            assert signals.engine_sample("vllm-0") is not None  # the pod's own vLLM-style /metrics
            assert signals.engine_sample("vllm-1") is None
            signals.forget("vllm-0")  # its slot set moved to another pod: the old reading goes
            assert signals.engine_sample("vllm-0") is None
            ns.set("vllm.test")
            await fleet.refresh()
            assert fleet.metrics_url("vllm-0") is None
        finally:
            await fleet.close()
