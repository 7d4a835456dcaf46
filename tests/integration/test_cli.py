"""The command line as a user runs it: real processes, real ports, the openai SDK."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import openai

from tests.servers import CliProcess, free_port_iter, run_cli, wait_until

EXAMPLE = Path(__file__).parents[2] / "examples" / "tidegate.yaml"


def test_check_config_accepts_the_example():
    done = run_cli("check-config", str(EXAMPLE), env={"TIDEGATE_API_KEY": "k"})
    assert done.returncode == 0, done.stderr
    assert "model deepseek-v4-pro: policy dedicated_first" in done.stdout
    assert done.stdout.rstrip().endswith("OK")


def test_check_config_lists_every_problem_and_fails(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "listen: {port: x}\nmodels:\n  m:\n    policy: nope\n    dedicated: [{name: d, base_url: 'http://d/v1', model: y}]\n"
    )
    done = run_cli("check-config", str(bad))
    assert done.returncode == 1
    assert "listen.port: Input should be a valid integer" in done.stderr
    assert "models.m.dedicated[0].max_concurrency: Field required (found nothing)" in done.stderr


def test_check_config_reports_an_unknown_policy(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "auth: {allow_anonymous: true}\nmodels:\n  m:\n    policy: nope\n    serverless: [{name: s, base_url: 'http://s/v1', model: y}]\n"
    )
    done = run_cli("check-config", str(bad))
    assert done.returncode == 1
    assert "models.m.policy: unknown policy 'nope' (known: dedicated_first)" in done.stderr


def test_serve_in_front_of_sim_processes(tmp_path):
    with (
        CliProcess(
            "sim", "--profile", "dedicated", "--port", "0", "--max-concurrency", "2", "--time-scale", "100"
        ) as ded,
        CliProcess("sim", "--profile", "serverless", "--preset", "fast", "--port", "0") as sl,
    ):
        config = tmp_path / "tidegate.yaml"
        config.write_text(
            "auth: {allow_anonymous: true}\nmodels:\n  chat:\n"
            f"    dedicated: [{{name: ded, base_url: '{ded.url}', model: d, max_concurrency: 2}}]\n"
            f"    serverless: [{{name: sl, base_url: '{sl.url}', model: s, api_key: '${{SL_KEY}}'}}]\n"
        )
        with CliProcess("serve", "--config", str(config), "--port", "0", env={"SL_KEY": "secret"}) as gw:
            client = openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0)
            raw = client.chat.completions.with_raw_response.create(
                model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
            assert raw.parse().choices[0].message.content == "the tide gate "
            assert raw.headers["x-tidegate-route"] == "ded"
            assert httpx.get(gw.root + "/readyz").status_code == 200
            # uvicorn shuts down gracefully on SIGTERM, then re-raises it to exit by the signal
            assert gw.stop() in (0, -signal.SIGTERM)
        assert httpx.get(ded.root + "/sim/stats").json()["completed"] == 1
        metrics = httpx.get(ded.root + "/metrics").text
        assert 'vllm:num_requests_running{model_name="sim"} 0.0' in metrics
    access = [line for line in gw.output if line.startswith("{")]
    assert len(access) == 1 and '"route":"ded"' in access[0]
    assert "secret" not in "".join(gw.output)
    assert "Traceback" not in "".join(gw.output)


def test_serve_refuses_a_bad_config_with_exit_2(tmp_path):
    config = tmp_path / "tidegate.yaml"
    config.write_text("models: {}\n")
    done = run_cli("serve", "--config", str(config))
    assert done.returncode == 2
    assert "at least one model" in done.stderr


def test_demo_starts_upstreams_and_answers_the_sdk():
    with CliProcess("demo", "--port", "0") as demo:
        client = openai.OpenAI(base_url=demo.url, api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="demo-model", messages=[{"role": "user", "content": "Hello"}]
        )
        assert reply.choices[0].message.content
        streamed = client.chat.completions.create(
            model="demo-model", messages=[{"role": "user", "content": "Hi"}], stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        routes = demo.root + "/admin/routes?window=1m"
        admin = {"authorization": "Bearer demo-admin"}
        wait_until(
            lambda: httpx.get(routes, headers=admin).json()["models"]["demo-model"]["requests"] == 2,
            timeout=5,
        )
        stats = run_cli("stats", "--url", demo.root, "--admin-key", "demo-admin", "--window", "1m")
    banner = "".join(demo.output)
    assert "client = OpenAI(base_url=" in banner and demo.url in banner
    assert f"tidegate stats --url {demo.root} --admin-key demo-admin --watch" in banner
    assert stats.returncode == 0, stats.stderr
    assert "demo-model" in stats.stdout and "2 requests" in stats.stdout


def test_serve_refuses_to_start_open_when_every_key_resolves_empty(tmp_path):
    config = tmp_path / "open.yaml"
    config.write_text(
        "auth: {api_keys: ['${TIDEGATE_API_KEY:-}']}\nmodels:\n  m:\n"
        "    serverless: [{name: s, base_url: 'http://127.0.0.1:1/v1', model: y}]\n"
    )
    done = run_cli("serve", "--config", str(config), "--port", "0", env={"TIDEGATE_API_KEY": ""})
    assert done.returncode == 2
    assert "auth: no client API key is set" in done.stderr
    assert "allow_anonymous" in done.stderr


def test_serve_refuses_to_start_when_redis_is_unreachable_unless_told_to_start_degraded(tmp_path):
    port = next(free_port_iter())
    text = (
        "auth: {{api_keys: [k]}}\nstate: {{redis_url: 'redis://:hunter2@127.0.0.1:{port}/0'{extra}}}\n"
        "models:\n  m:\n    serverless: [{{name: s, base_url: 'http://127.0.0.1:1/v1', model: y}}]\n"
    )
    config = tmp_path / "redis.yaml"
    config.write_text(text.format(port=port, extra=""))
    done = run_cli("serve", "--config", str(config), "--port", "0")
    assert done.returncode == 2, done.stderr
    assert "state.redis_url: cannot use Redis" in done.stderr
    assert "hunter2" not in done.stderr + done.stdout
    config.write_text(text.format(port=port, extra=", start_degraded: true"))
    with CliProcess("serve", "--config", str(config), "--port", "0") as gw:
        wait_until(lambda: httpx.get(gw.root + "/readyz").status_code == 200, timeout=10)
        assert httpx.get(gw.root + "/readyz").json()["status"] == "degraded"
    assert "start_degraded is set" in "".join(gw.output)
