"""Config loading: the canonical example, env substitution, and precise errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.config import ConfigError, DedicatedEndpoint, load_config, parse_config

EXAMPLE = Path(__file__).parents[2] / "examples" / "tidegate.yaml"
MINIMAL = """
auth: {allow_anonymous: true}
models:
  m:
    serverless:
      - {name: a, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: "http://127.0.0.1:1/v1", model: x}
"""


def test_canonical_example_loads_and_means_what_its_comments_say():
    config = load_config(EXAMPLE, env={"TIDEGATE_API_KEY": "k1", "PROVIDER_A_KEY": "pa"})
    model = config.models["deepseek-v4-pro"]
    assert config.state.redis_url == ""
    assert config.auth.api_keys == ("k1",)
    assert model.canary_percent == 100
    assert model.slo.ttft_p95_ms == 1500
    assert (model.retry.attempts, model.retry.backoff_ms, model.retry.budget_percent) == (3, 100, 20)
    (pool,) = model.dedicated
    assert isinstance(pool, DedicatedEndpoint)
    assert (pool.name, pool.model, pool.max_concurrency, pool.gpus) == (
        "h100-pool",
        "deepseek-ai/DeepSeek-V4-Pro",
        64,
        8,
    )
    assert [s.name for s in model.serverless] == ["provider-a", "provider-b"]
    assert model.serverless[0].api_key == "pa"
    assert model.serverless[1].api_key == ""
    assert (config.state.window_s, config.state.retention_s, config.state.fallback_share) == (60, 86400, 0.5)
    assert (config.limits.max_output_tokens, config.limits.drain_s) == (1048576, 30)
    assert (model.breaker.consecutive_failures, model.breaker.cooldown_s, model.breaker.max_cooldown_s) == (
        5,
        5,
        60,
    )
    assert (model.slo.recover_ratio, model.slo.min_samples, model.slo.dwell_s) == (0.8, 20, 10)
    assert model.routing.serverless == "configured" and model.routing.max_queue_ms == 0
    signal = pool.engine_signal
    assert signal is not None
    assert (signal.on_stale, signal.max_running, signal.waiting_on, signal.kv_cache_off) == (
        "trust_leases",
        64,
        1,
        0.85,
    )


def test_the_example_refuses_to_start_without_its_client_key():
    with pytest.raises(ConfigError) as caught:
        load_config(EXAMPLE, env={})
    assert "TIDEGATE_API_KEY is not set" in str(caught.value)


@pytest.mark.parametrize(
    ("auth", "refused_because"),
    [
        ("{}", "no client API key is set"),
        ("{api_keys: []}", "no client API key is set"),
        ("{api_keys: ['${EMPTY:-}', '']}", "no client API key is set"),
        ("{api_keys: [k], allow_anonymous: true}", "choose one"),
        ("{api_keys: [k], admin_key: k}", "admin_key must differ"),
    ],
)
def test_auth_fails_closed(auth, refused_because):
    with pytest.raises(ConfigError) as caught:
        parse_config(MINIMAL.replace("auth: {allow_anonymous: true}", f"auth: {auth}"), {})
    assert refused_because in str(caught.value)
    assert "auth" in caught.value.problems[0]


@pytest.mark.parametrize(
    ("auth", "keys", "anonymous"),
    [("{api_keys: [k1, '']}", ("k1",), False), ("{allow_anonymous: true}", (), True)],
)
def test_auth_is_open_only_when_said(auth, keys, anonymous):
    config = parse_config(MINIMAL.replace("auth: {allow_anonymous: true}", f"auth: {auth}"), {})
    assert (config.auth.api_keys, config.auth.allow_anonymous) == (keys, anonymous)


def test_unset_variable_without_default_is_an_error_with_its_path():
    text = MINIMAL.replace("model: x}", "model: x, api_key: '${MISSING_KEY}'}")
    with pytest.raises(ConfigError) as caught:
        parse_config(text, {})
    assert caught.value.problems == [
        "models.m.serverless[0].api_key: environment variable MISSING_KEY is not set (use ${MISSING_KEY:-} for a default)"
    ]


def test_variable_default_and_embedded_references():
    text = MINIMAL.replace('"http://127.0.0.1:1/v1"', '"http://${HOST:-localhost}:${PORT}/v1"')
    config = parse_config(text, {"PORT": "9"})
    assert config.models["m"].serverless[0].base_url == "http://localhost:9/v1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("models: {}", "models: at least one model must be configured (found an empty mapping)"),
        (
            "listen: {port: 70000}\n" + MINIMAL,
            "listen.port: Input should be less than or equal to 65535 (found 70000)",
        ),
        (
            MINIMAL.replace("model: x", "model: x, max_concurrency: 4"),
            "models.m.serverless[0].max_concurrency: Extra inputs are not permitted (found 4)",
        ),
        (
            MINIMAL.replace("serverless", "dedicated").replace("model: x", "model: x, max_concurrency: lots"),
            "models.m.dedicated[0].max_concurrency: Input should be a valid integer, unable to parse string as an integer (found 'lots')",
        ),
        (
            MINIMAL.replace("model: x", "model: x2}\n      - {name: a, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: 'http://h/v1', model: y"),
            "models.m: endpoint name 'a' is used twice",
        ),
        (
            "auth: {allow_anonymous: true}\nmodels:\n  m: {canary_percent: 5}\n",
            "models.m: needs at least one dedicated or serverless endpoint",
        ),
        (
            MINIMAL.replace("http://127.0.0.1:1/v1", "ftp://x"),
            "models.m.serverless[0].base_url: String should match pattern '^https?://' (found 'ftp://x')",
        ),
        ("- just\n- a list\n", "top level: expected a mapping, found list"),
        (
            MINIMAL.replace("model: x}", "model: x}\n    routing: {serverless: quickest}"),
            "models.m.routing.serverless: Input should be 'configured' or 'fastest' (found 'quickest')",
        ),
        (
            MINIMAL.replace("model: x}", "model: x}\n    routing: {max_queue_ms: 60000}"),
            "models.m.routing.max_queue_ms: Input should be less than or equal to 10000 (found 60000)",
        ),
    ],
)
def test_invalid_configs_name_the_key_path_expected_and_found(text, expected):
    with pytest.raises(ConfigError) as caught:
        parse_config(text, {})
    assert expected in caught.value.problems


def test_every_problem_is_reported_at_once():
    text = "listen: {port: -1}\nmodels:\n  m: {canary_percent: 150, serverless: [{name: a}]}\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, {})
    assert len(caught.value.problems) >= 4  # port, canary, base_url missing, model missing


def test_the_example_hedges_slow_dedicated_first_tokens():
    config = load_config(EXAMPLE, env={"TIDEGATE_API_KEY": "k1"})
    hedge = config.models["deepseek-v4-pro"].hedge
    assert hedge is not None
    assert (hedge.after_ms, hedge.max_percent, hedge.window_s) == (1000, 5, 60)


@pytest.mark.parametrize(
    ("hedge", "refused_because"),
    [
        ("{max_percent: 5}", "after_ms"),  # required
        ("{after_ms: 0}", "after_ms"),
        ("{after_ms: 100, max_percent: 0}", "max_percent"),
        ("{after_ms: 100, max_percent: 101}", "max_percent"),
        ("{after_ms: 100, window_s: 0}", "window_s"),
        ("{after_ms: 100, typo: 1}", "typo"),
    ],
)
def test_a_wrong_hedge_is_refused_naming_its_key(hedge, refused_because):
    text = MINIMAL.replace("  m:\n", f"  m:\n    hedge: {hedge}\n") + (
        '    dedicated: [{name: d, gpu_hour_usd: 0, base_url: "http://127.0.0.1:2/v1", model: x, max_concurrency: 4}]\n'
    )
    with pytest.raises(ConfigError) as caught:
        parse_config(text, {})
    assert "hedge" in str(caught.value) and refused_because in str(caught.value)


def test_a_hedge_needs_a_dedicated_endpoint_to_race():
    with pytest.raises(ConfigError) as caught:
        parse_config(MINIMAL.replace("  m:\n", "  m:\n    hedge: {after_ms: 100}\n"), {})
    assert "hedge needs both a dedicated and a serverless endpoint" in str(caught.value)


@pytest.mark.parametrize(
    ("state", "keep_warm", "refused_because"),
    [
        ("", "{interval_s: 30, when: schedule}", "keep_warm.when: schedule needs state.redis_url"),
        (
            "state: {redis_url: 'redis://127.0.0.1:1/0'}\n",
            "{interval_s: 30, when: schedule, schedule_days: 2}",
            "keep_warm.schedule_days: 2 days is longer than state.retention_s keeps",
        ),
        (
            "",
            "{interval_s: 30, learn: true, min_interval_s: 60}",
            "min_interval_s must not exceed interval_s",
        ),
        ("", "{interval_s: 30, when: sometimes}", "when"),
    ],
)
def test_a_keep_warm_that_cannot_work_is_refused_naming_its_key(state, keep_warm, refused_because):
    text = state + MINIMAL.replace("model: x}", f"model: x, keep_warm: {keep_warm}}}")
    with pytest.raises(ConfigError) as caught:
        parse_config(text, {})
    assert refused_because in str(caught.value)
    assert "models.m.serverless" in str(caught.value) or "keep_warm" in str(caught.value)


def test_a_scheduled_keep_warm_with_redis_and_enough_retention_loads():
    text = "state: {redis_url: 'redis://127.0.0.1:1/0', retention_s: 172800}\n" + MINIMAL.replace(
        "model: x}", "model: x, keep_warm: {interval_s: 30, when: schedule, schedule_days: 2}}"
    )
    warm = parse_config(text, {}).models["m"].serverless[0].keep_warm
    assert warm is not None and (warm.when, warm.schedule_days, warm.schedule_min_spills) == (
        "schedule",
        2,
        1.0,
    )
