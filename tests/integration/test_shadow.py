"""Shadow traffic from outside (issue 29): two gateway replicas sharing a real Redis mirror
every request (`percent: 100`) to a candidate simulator that takes no live traffic; the
client's answers are the live route's; the day's dollar cap is reached and held across a
replica's SIGKILL; agreement and spend are per endpoint in `/admin/routes` and Prometheus."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import httpx
import openai
import orjson
import pytest
import redis

from router.economics.cost import token_cost_usd
from tests.servers import CliProcess, Sim, wait_until
from tidegate.sim.profile import SERVERLESS_PRESETS, Kind, Persona, SimProfile

ADMIN = "shadow-admin"
MAX_TOKENS = 8
PRICE = (0.5, 1.5)  # the candidate's $ per M tokens in and out
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
        },
    },
]


def body(i: int) -> dict:
    """Every request the same size, so each reserves the same worst case."""
    return {
        "model": "m",
        "messages": [{"role": "user", "content": f"question {i:05d}"}],
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": MAX_TOKENS,
    }


def reservation() -> float:
    """What router/spill/shadow.py reserves per request: the shadow body (model renamed, no
    stream) at four bytes a token plus eight, and max_tokens."""
    shadowed = {k: v for k, v in body(0).items() if k != "stream"} | {"model": "cand-model"}
    return token_cost_usd(len(orjson.dumps(shadowed)) // 4 + 8, MAX_TOKENS, *PRICE)


def write_config(path: Path, ded: Sim, live: Sim, candidate: Sim, redis_url: str, cap_usd: float) -> Path:
    path.write_text(
        f"state: {{redis_url: '{redis_url}', leader_ttl_s: 2}}\n"
        f"auth: {{allow_anonymous: true, admin_key: {ADMIN}}}\nmodels:\n  m:\n"
        "    shadow:\n"
        f"      candidate: {{name: cand, base_url: '{candidate.base_url}', model: cand-model,"
        f" usd_per_mtok_in: {PRICE[0]}, usd_per_mtok_out: {PRICE[1]}}}\n"
        f"      percent: 100\n      max_usd_per_day: {cap_usd!r}\n      max_in_flight: 64\n"
        "      compare: {agree: tool_name}\n"
        f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded.base_url}', model: d, max_concurrency: 8}}]\n"
        f"    serverless: [{{name: sl, base_url: '{live.base_url}', model: s, usd_per_mtok_in: 0.2,"
        " usd_per_mtok_out: 0.6}]\n"
    )
    return path


def serverless(name: str, persona: Persona = Persona.FAITHFUL, share: float = 0.0) -> SimProfile:
    return SimProfile(
        kind=Kind.SERVERLESS,
        name=name,
        ttft=SERVERLESS_PRESETS["fast"],
        serverless_itl_s=0.001,
        time_scale=10.0,
        seed=1,
        persona=persona,
        persona_share=share,
    )


def send(url: str, i: int) -> str:
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=30)
    answer = client.chat.completions.create(**body(i))
    return answer.choices[0].message.tool_calls[0].function.name


def shadow_metrics(root: str, endpoint: str = "cand") -> dict[str, float]:
    """tidegate_shadow_total by result for one endpoint, from the replica's /metrics."""
    found: dict[str, float] = {}
    for line in httpx.get(root + "/metrics").text.splitlines():
        match = re.match(rf'tidegate_shadow_total\{{endpoint="{endpoint}",result="(\w+)"\}} ([\d.e+]+)', line)
        if match:
            found[match.group(1)] = float(match.group(2))
    return found


def sent_of(metrics: dict[str, float]) -> int:
    """The shadows a replica sent (the rest were dropped: capped, busy, ...)."""
    return int(sum(metrics.get(r, 0) for r in ("agree", "disagree", "not_compared", "failed_check", "error")))


def shadow_ledgers(redis_url: str) -> float:
    """What the shadow ledgers in Redis hold: settled spend (and reservations still open)."""
    client = redis.Redis.from_url(redis_url)
    return sum(float(client.get(key) or 0) for key in client.scan_iter("tidegate:spend:{shadow:*"))


def report(root: str) -> dict:
    routes = httpx.get(root + "/admin/routes", headers={"authorization": f"Bearer {ADMIN}"}).json()
    return routes["models"]["m"]["shadow"]


@pytest.mark.timeout(120)
def test_the_cap_is_reached_and_held_across_a_sigkill_and_the_client_sees_only_the_live_answer(
    tmp_path, redis_url
):
    """Each shadow reserves its worst case before it is sent and settles to what its answer
    cost, so the day's spend never passes the cap: with room for two and a half reservations,
    the candidate gets what settled answers leave room for, and every other shadow is capped."""
    cap = reservation() * 2.5
    ded_profile = SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=64, itl_s=0.001, seed=1)
    with (
        Sim(ded_profile) as ded,
        Sim(serverless("sl")) as live,
        Sim(serverless("cand", Persona.TOOL_DRIFT, share=1.0)) as cand,
    ):
        config = write_config(tmp_path / "s.yaml", ded, live, cand, redis_url, cap)
        with CliProcess("serve", "--config", str(config), "--port", "0") as a:
            with CliProcess("serve", "--config", str(config), "--port", "0") as b:
                names = [send((a, b)[i % 2].url, i) for i in range(6)]
                wait_until(lambda: sum(shadow_metrics(b.root).values()) == 3, timeout=10)
                b_sent = sent_of(shadow_metrics(b.root))
                b.stop(signal.SIGKILL)  # one replica dies; the day's spend is in Redis, not in it
            names += [send(a.url, i) for i in range(6, 16)]
            wait_until(lambda: sum(shadow_metrics(a.root).values()) == 13, timeout=10)  # 3 before the kill
            metrics = shadow_metrics(a.root)
            wait_until(lambda: report(a.root)["sent"] >= sent_of(metrics), timeout=10)  # a's own, flushed
            routes = httpx.get(a.root + "/admin/routes", headers={"authorization": f"Bearer {ADMIN}"}).json()
        cand_requests = cand.stats()["requests"]
    assert names == ["get_weather"] * 16, "the client always gets the live answer"
    assert cand_requests == b_sent + sent_of(metrics), "every shadow sent is counted by its replica"
    spent = shadow_ledgers(redis_url)
    assert 0 < spent <= cap, "the day's shadow ledger, across both replicas and the kill, stays within the cap"
    assert cand_requests > 2, "settled reservations left room for more than the cap's two and a half"
    assert cand_requests < 16 and metrics["capped"] >= 1, "the cap was reached and held"
    shadow = routes["models"]["m"]["shadow"]
    assert shadow["endpoint"] == "cand" and shadow["candidate"] is True
    assert shadow["compared"] == shadow["sent"]
    # tool-drift on every request: some call the other tool (disagree), the rest drop an argument
    assert shadow["agreement"] is not None and shadow["agreement"] < 1.0
    assert shadow["cost_usd"] > 0 and routes["models"]["m"]["economics"]["shadow_usd"] == shadow["cost_usd"]
    live_cost = routes["models"]["m"]["economics"]["routes"]["sl"]["cost_usd"] or 0.0
    assert "cand" not in routes["models"]["m"]["routes"] and live_cost == 0.0  # never in a route's figures


def test_no_shadow_header_small_percent_and_size_limits_are_obeyed(tmp_path, redis_url):
    ded_profile = SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=64, itl_s=0.001, seed=1)
    with Sim(ded_profile) as ded, Sim(serverless("sl")) as live, Sim(serverless("cand")) as cand:
        config = write_config(tmp_path / "s.yaml", ded, live, cand, redis_url, 1.0)
        config.write_text(
            config.read_text().replace(
                "      percent: 100\n", "      percent: 100\n      max_prompt_tokens: 200\n"
            )
        )
        with CliProcess("serve", "--config", str(config), "--port", "0") as gw:
            client = openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0, timeout=30)
            client.chat.completions.create(**body(1), extra_headers={"x-tidegate-no-shadow": "1"})
            big = body(2) | {"messages": [{"role": "user", "content": "x" * 4000}]}
            client.chat.completions.create(**big)
            client.chat.completions.create(**body(3), stream=False)
            wait_until(lambda: cand.stats()["requests"] >= 1, timeout=10)
            metrics = shadow_metrics(gw.root)
        mirrored = cand.stats()["requests"]
    assert mirrored == 1, "only the small request without the header was mirrored"
    assert metrics == {"agree": 1.0}


def test_a_dedicated_shadow_takes_only_free_slots_and_is_dropped_under_load(tmp_path, redis_url):
    """Live traffic on serverless (canary 0), the shadow on the dedicated pool of 2 slots with
    half of it kept free: at most one shadow request holds a slot; the rest are dropped."""
    slow = SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=64, itl_s=0.05, seed=1)
    with Sim(slow) as ded, Sim(serverless("sl")) as live:
        (tmp_path / "s.yaml").write_text(
            f"state: {{redis_url: '{redis_url}'}}\n"
            f"auth: {{allow_anonymous: true, admin_key: {ADMIN}}}\nmodels:\n  m:\n"
            "    canary_percent: 0\n"
            "    shadow: {endpoint: ded, percent: 100, max_in_flight: 64, min_free_percent: 50}\n"
            f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded.base_url}', model: d, max_concurrency: 2}}]\n"
            f"    serverless: [{{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{live.base_url}', model: s}}]\n"
        )
        with CliProcess("serve", "--config", str(tmp_path / "s.yaml"), "--port", "0") as gw:
            client = openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0, timeout=30)
            import concurrent.futures  # noqa: PLC0415

            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                answers = list(
                    pool.map(
                        lambda i: client.chat.completions.with_raw_response.create(
                            model="m",
                            messages=[{"role": "user", "content": f"q{i}"}],
                            max_tokens=20,
                            user=f"u{i}",
                        ),
                        range(6),
                    )
                )
            wait_until(lambda: sum(shadow_metrics(gw.root, "ded").values()) == 6, timeout=15)
            metrics = shadow_metrics(gw.root, "ded")
        stats = ded.stats()
    assert {a.headers["x-tidegate-route"] for a in answers} == {"sl"}
    assert stats["max_in_flight"] == 1, "the shadow held at most the pool's usable half"
    sent = sum(v for k, v in metrics.items() if k != "no_free_slot")
    assert metrics["no_free_slot"] >= 1 and sent >= 1, metrics
