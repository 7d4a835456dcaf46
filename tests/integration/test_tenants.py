"""Keys as tenants from outside (issue 30): named keys with limits across two gateway replicas
sharing a real Redis; OpenAI's rate-limit headers and refusals as the SDK reads them; budgets
refused before any upstream is called; keys created, rotated and revoked through the admin API
and obeyed by every replica."""

from __future__ import annotations

import concurrent.futures
import hashlib
import time
from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest

from tests.servers import CliProcess, Sim, run_cli, wait_until
from tidegate.sim.profile import SERVERLESS_PRESETS, Kind, SimProfile

ADMIN = "tenant-admin"
LIMITED, FREE, THRIFTY = "sk-limited-0001", "sk-free-0002", "sk-thrifty-0003"


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def write_config(path: Path, ded: Sim, sl: Sim, redis_url: str) -> Path:
    path.write_text(
        f"state: {{redis_url: '{redis_url}'}}\n"
        "auth:\n"
        f"  admin_key: {ADMIN}\n"
        "  keys:\n"
        f"    - {{name: limited, team: search, key_sha256: {digest(LIMITED)}, rpm: 60}}\n"
        f"    - {{name: free, team: search, key_sha256: {digest(FREE)}}}\n"
        f"    - {{name: thrifty, team: ops, key_sha256: {digest(THRIFTY)}, max_usd_per_day: 0.000001,"
        " models: [m]}\n"
        "models:\n  m:\n"
        f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded.base_url}', model: d, max_concurrency: 1}}]\n"
        f"    serverless: [{{name: sl, base_url: '{sl.base_url}', model: s, usd_per_mtok_in: 1.0,"
        " usd_per_mtok_out: 2.0}]\n"
        "  other:\n"
        f"    serverless: [{{name: sl2, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl.base_url}', model: s}}]\n"
    )
    return path


@pytest.fixture
def sims():
    ded = SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=64, itl_s=0.001, seed=1)
    sl = SimProfile(
        kind=Kind.SERVERLESS,
        name="sl",
        ttft=SERVERLESS_PRESETS["fast"],
        serverless_itl_s=0.001,
        time_scale=10.0,
    )
    with Sim(ded) as d, Sim(sl) as s:
        yield d, s


def ask(url: str, key: str, model: str = "m") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return httpx.post(
        url + "/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=30
    )


@pytest.mark.timeout(120)
def test_an_rpm_key_gets_exactly_its_limit_across_two_replicas_and_the_other_key_is_unaffected(
    tmp_path, sims, redis_url
):
    config = write_config(tmp_path / "t.yaml", *sims, redis_url)
    with (
        CliProcess("serve", "--config", str(config), "--port", "0") as a,
        CliProcess("serve", "--config", str(config), "--port", "0") as b,
        concurrent.futures.ThreadPoolExecutor(16) as pool,
    ):
        started = time.monotonic()
        limited = list(pool.map(lambda i: ask((a, b)[i % 2].url, LIMITED), range(200)))
        free = list(pool.map(lambda i: ask((a, b)[i % 2].url, FREE), range(100)))
        took = time.monotonic() - started
        client = openai.OpenAI(base_url=a.url, api_key=LIMITED, max_retries=0)
        with pytest.raises(openai.RateLimitError) as error:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert took < 55, "all inside one minute's window"
    statuses = Counter(r.status_code for r in limited)
    assert statuses[200] == 60 and statuses[429] == 140, statuses
    assert Counter(r.status_code for r in free) == {200: 100}
    ok = [r for r in limited if r.status_code == 200]
    assert {r.headers["x-ratelimit-limit-requests"] for r in ok} == {"60"}
    assert sorted(int(r.headers["x-ratelimit-remaining-requests"]) for r in ok) == list(range(60))
    refused = [r for r in limited if r.status_code == 429]
    for r in refused:
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert r.headers["x-ratelimit-remaining-requests"] == "0"
        assert r.headers["x-ratelimit-reset-requests"].endswith("s")
        assert 1 <= int(r.headers["retry-after"]) <= 60
    assert "x-ratelimit-limit-requests" not in free[0].headers  # no limit, no figures
    assert error.value.code == "rate_limit_exceeded"


def test_a_spent_budget_is_refused_with_insufficient_quota_before_any_upstream(tmp_path, sims, redis_url):
    ded, sl = sims
    config = write_config(tmp_path / "t.yaml", ded, sl, redis_url)
    with CliProcess("serve", "--config", str(config), "--port", "0") as gw:
        httpx.put(
            gw.root + "/admin/models/m/canary",
            json={"percent": 0},
            headers={"authorization": f"Bearer {ADMIN}"},
        )
        not_allowed = ask(gw.url, THRIFTY, model="other")  # the model is read once the budget allows it
        assert ask(gw.url, THRIFTY).status_code == 200  # spends more than its budget: the next is refused
        wait_until(lambda: _spent(gw.root, "thrifty") > 0.000001, timeout=10, interval=0.1)
        before = sl.stats()["requests"] + ded.stats()["requests"]
        refused = ask(gw.url, THRIFTY)
        after = sl.stats()["requests"] + ded.stats()["requests"]
        client = openai.OpenAI(base_url=gw.url, api_key=THRIFTY)  # the SDK's own retries on
        with pytest.raises(openai.RateLimitError) as error:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        sdk_calls = sl.stats()["requests"] + ded.stats()["requests"] - after
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "insufficient_quota"
    assert refused.headers["x-should-retry"] == "false"
    assert error.value.code == "insufficient_quota" and sdk_calls == 0
    assert not_allowed.status_code == 403 and not_allowed.json()["error"]["param"] == "model"
    assert after == before, "no upstream was called for a refused key"


def _spent(root: str, name: str) -> float:
    keys = httpx.get(root + "/admin/keys", headers={"authorization": f"Bearer {ADMIN}"}).json()["keys"]
    return next(k["spent_usd_today"] for k in keys if k["name"] == name)


@pytest.mark.timeout(120)
def test_made_keys_rotate_with_an_overlap_and_a_revoked_key_is_refused_on_every_replica(
    tmp_path, sims, redis_url
):
    config = write_config(tmp_path / "t.yaml", *sims, redis_url)
    env = {"TIDEGATE_ADMIN_KEY": ADMIN}
    with (
        CliProcess("serve", "--config", str(config), "--port", "0") as a,
        CliProcess("serve", "--config", str(config), "--port", "0") as b,
    ):
        made = run_cli("keys", "create", "reports", "--team", "bi", "--rpm", "100", "--url", a.root, env=env)
        assert made.returncode == 0, made.stderr
        first = made.stdout.strip().split(": ", 1)[1]
        wait_until(lambda: ask(b.url, first).status_code == 200, timeout=10, interval=0.05)  # the other replica
        rotated = run_cli("keys", "rotate", "reports", "--overlap-s", "5", "--url", b.root, env=env)
        assert rotated.returncode == 0, rotated.stderr
        second = rotated.stdout.strip().split(": ", 1)[1]
        assert second != first
        wait_until(lambda: ask(a.url, second).status_code == 200, timeout=10, interval=0.05)
        assert ask(a.url, first).status_code == 200 and ask(b.url, first).status_code == 200  # the overlap
        wait_until(lambda: ask(a.url, first).status_code == 401, timeout=20, interval=0.1)
        assert ask(b.url, first).status_code == 401 and ask(b.url, second).status_code == 200
        listed = run_cli("keys", "list", "--url", a.root, env=env)
        assert "reports" in listed.stdout and "limited" in listed.stdout
        assert run_cli("keys", "revoke", "reports", "--url", a.root, env=env).returncode == 0
        for replica in (a, b):  # the deadline only bounds a hang
            wait_until(lambda r=replica: ask(r.url, second).status_code == 401, timeout=10, interval=0.05)
        config_revoke = run_cli("keys", "revoke", "free", "--url", b.root, env=env)
        assert config_revoke.returncode == 0
        wait_until(lambda: ask(a.url, FREE).status_code == 401, timeout=10, interval=0.05)
        twice = run_cli("keys", "create", "limited", "--url", a.root, env=env)
    assert twice.returncode == 1 and "exists" in twice.stderr


def test_with_redis_down_a_limited_key_is_refused_clearly_and_an_unlimited_one_is_served(tmp_path, sims):
    """A limit that cannot be counted is not guessed: 503 with Retry-After for the limited key;
    the key without limits is served from the local fallback, and both are back with Redis."""
    from tests.servers import RedisServer  # noqa: PLC0415

    own = RedisServer().start()
    try:
        config = write_config(tmp_path / "t.yaml", *sims, own.url)
        with CliProcess("serve", "--config", str(config), "--port", "0") as gw:
            assert ask(gw.url, LIMITED).status_code == 200
            own.stop()
            limited, free = ask(gw.url, LIMITED), ask(gw.url, FREE)
            own.start()
            wait_until(lambda: ask(gw.url, LIMITED).status_code == 200, timeout=15, interval=0.2)
    finally:
        own.stop()
    assert limited.status_code == 503 and limited.json()["error"]["code"] == "state_store_unavailable"
    assert limited.headers["retry-after"] == "1" and "key limited" in limited.json()["error"]["message"]
    assert free.status_code == 200
