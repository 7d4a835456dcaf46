"""The command line as a user runs it: real processes, real ports, the openai SDK."""

from __future__ import annotations

import re
import shlex
import signal
import socket
import subprocess
import textwrap
from pathlib import Path

import httpx
import openai

from tests.servers import CliProcess, RedisServer, free_port_iter, run_cli, wait_until

EXAMPLE = Path(__file__).parents[2] / "examples" / "tidegate.yaml"


def test_check_config_accepts_the_example():
    done = run_cli("check-config", str(EXAMPLE), env={"TIDEGATE_API_KEY": "k"})
    assert done.returncode == 0, done.stderr
    assert "model deepseek-v4-pro: policy dedicated_first" in done.stdout
    assert done.stdout.rstrip().endswith("OK")


def test_check_config_lists_every_problem_and_fails(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "listen: {port: x}\nmodels:\n  m:\n    policy: nope\n    dedicated: [{name: d, gpu_hour_usd: 0, base_url: 'http://d/v1', model: y}]\n"
    )
    done = run_cli("check-config", str(bad))
    assert done.returncode == 1
    assert "listen.port: Input should be a valid integer" in done.stderr
    assert "models.m.dedicated[0].max_concurrency: Field required (found nothing)" in done.stderr


def test_check_config_reports_an_unknown_policy(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "auth: {allow_anonymous: true}\nmodels:\n  m:\n    policy: nope\n    serverless: [{name: s, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: 'http://s/v1', model: y}]\n"
    )
    done = run_cli("check-config", str(bad))
    assert done.returncode == 1
    assert "models.m.policy: unknown policy 'nope' (known: dedicated_first)" in done.stderr


def test_check_config_refuses_a_redis_url_serve_could_not_use(tmp_path):
    """Beside the schema's problems: the URL as start-up would read it (scheme, options)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "auth: {allow_anonymous: true}\nstate: {redis_url: 'http://127.0.0.1:6379/0'}\nmodels:\n  m:\n"
        "    policy: nope\n    serverless: [{name: s, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: 'http://s/v1', model: y}]\n"
    )
    done = run_cli("check-config", str(bad))
    assert done.returncode == 1
    assert "2 problem(s)" in done.stderr
    assert "state.redis_url: scheme 'http': expected one of redis, rediss, unix" in done.stderr
    assert "models.m.policy: unknown policy 'nope'" in done.stderr


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
            f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded.url}', model: d, max_concurrency: 2}}]\n"
            f"    serverless: [{{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl.url}', model: s, api_key: '${{SL_KEY}}'}}]\n"
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
            model="demo-model", messages=[{"role": "user", "content": "Hello"}], max_tokens=5
        )
        assert reply.choices[0].message.content
        streamed = client.chat.completions.create(
            model="demo-model", messages=[{"role": "user", "content": "Hi"}], stream=True, max_tokens=5
        )
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        routes = demo.root + "/admin/routes?window=1m"
        admin = {"authorization": "Bearer demo-admin"}
        wait_until(
            lambda: httpx.get(routes, headers=admin).json()["models"]["demo-model"]["requests"] == 2,
            timeout=5,
        )
        banner = "".join(demo.output)
        stats = run_printed(banner, " stats --url ", "--window", "1m")
        canary = run_printed(banner, " canary status demo-model ")
        snippet = run_printed_python(banner)
    assert "client = OpenAI(base_url=" in banner and demo.url in banner
    assert f"stats --url {demo.root} --admin-key demo-admin --watch" in banner
    assert f"canary status demo-model --url {demo.root} --admin-key demo-admin --watch" in banner
    assert stats.returncode == 0, stats.stderr
    assert "demo-model" in stats.stdout and "2 requests" in stats.stdout
    assert canary.returncode == 0, canary.stderr
    assert "demo-model" in canary.stdout
    assert snippet.returncode == 0, snippet.stderr
    assert snippet.stdout.strip()  # the simulated answer
    assert '"route"' not in "".join(demo.output)  # quiet by default: the banner stays on screen


def run_printed(banner: str, marker: str, *more: str) -> subprocess.CompletedProcess[str]:
    """Run the banner's command containing `marker` as printed, without `--watch` (it never ends)."""
    (line,) = [line for line in banner.splitlines() if marker in line]
    argv = [word for word in shlex.split(line) if word != "--watch"]
    return subprocess.run([*argv, *more], check=False, capture_output=True, text=True, timeout=60)


def run_printed_python(banner: str) -> subprocess.CompletedProcess[str]:
    """Run the banner's Python snippet with the interpreter it names."""
    interpreter = re.search(r"In Python, with (\S+?):", banner)
    assert interpreter, banner
    lines = banner.splitlines()
    start = next(i for i, line in enumerate(lines) if "from openai import OpenAI" in line)
    end = next(i for i in range(start, len(lines)) if "print(reply" in lines[i])
    code = textwrap.dedent("\n".join(lines[start : end + 1]))
    return subprocess.run(
        [interpreter.group(1), "-c", code], check=False, capture_output=True, text=True, timeout=60
    )


def test_demo_logs_each_request_when_asked():
    with CliProcess("demo", "--port", "0", "--log-level", "info") as demo:
        client = openai.OpenAI(base_url=demo.url, api_key="unused", max_retries=0)
        client.chat.completions.create(model="demo-model", messages=[{"role": "user", "content": "Hi"}])
        wait_until(lambda: '"route"' in "".join(demo.output), timeout=10)
    assert "--log-level info shows" not in "".join(demo.output)


def test_demo_on_a_taken_port_says_so_in_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("demo", "--port", str(port))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"tidegate: cannot start: 127.0.0.1:{port} is already in use by another process; "
        "choose another port with --port N, or make demo PORT=N (0: any free port)"
    ], done.stderr
    assert "listening" not in done.stdout


def test_serve_on_a_taken_port_says_so_in_one_line(tmp_path):
    config = tmp_path / "t.yaml"
    config.write_text(
        "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
        "    serverless: [{name: s, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: 'http://127.0.0.1:1/v1', model: y}]\n"
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("serve", "--config", str(config), "--port", str(port))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"tidegate: cannot start: 127.0.0.1:{port} is already in use by another process; "
        "choose another port with --port or listen.port (0: any free port)"
    ], done.stderr


def test_serve_refuses_to_start_open_when_every_key_resolves_empty(tmp_path):
    config = tmp_path / "open.yaml"
    config.write_text(
        "auth: {api_keys: ['${TIDEGATE_API_KEY:-}']}\nmodels:\n  m:\n"
        "    serverless: [{name: s, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: 'http://127.0.0.1:1/v1', model: y}]\n"
    )
    done = run_cli("serve", "--config", str(config), "--port", "0", env={"TIDEGATE_API_KEY": ""})
    assert done.returncode == 2
    assert "auth: no client API key is set" in done.stderr
    assert "allow_anonymous" in done.stderr


def test_serve_refuses_to_start_when_redis_is_unreachable_unless_told_to_start_degraded(tmp_path):
    port = next(free_port_iter())
    text = (
        "auth: {{api_keys: [k]}}\nstate: {{redis_url: 'redis://:hunter2@127.0.0.1:{port}/0'{extra}}}\n"
        "models:\n  m:\n    serverless: [{{name: s, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: 'http://127.0.0.1:1/v1', model: y}}]\n"
    )
    config = tmp_path / "redis.yaml"
    config.write_text(text.format(port=port, extra=""))
    done = run_cli("serve", "--config", str(config), "--port", "0")
    assert done.returncode == 2, done.stderr
    assert_refused_in_one_line_before_listening(done.stdout, done.stderr)
    assert "hunter2" not in done.stderr + done.stdout
    config.write_text(text.format(port=port, extra=", start_degraded: true"))
    with CliProcess("serve", "--config", str(config), "--port", "0") as gw:
        wait_until(lambda: httpx.get(gw.root + "/readyz").status_code == 200, timeout=10)
        assert httpx.get(gw.root + "/readyz").json()["status"] == "degraded"
    assert "start_degraded is set" in "".join(gw.output)


def assert_refused_in_one_line_before_listening(stdout: str, stderr: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("tidegate: cannot start: state.redis_url: cannot use Redis"), stderr
    assert "Traceback" not in stderr
    assert "listening" not in (stdout + stderr).lower()


def test_serve_refuses_a_redis_that_refuses_its_password_in_one_line(tmp_path):
    server = RedisServer(password="right-one").start()
    try:
        config = tmp_path / "redis.yaml"
        for secret in (":wrong-one@", ""):  # a wrong password, and none where one is required
            config.write_text(
                f"auth: {{api_keys: [k]}}\nstate: {{redis_url: 'redis://{secret}127.0.0.1:{server.port}/0'}}\n"
                "models:\n  m:\n    serverless: [{name: s, usd_per_mtok_in: 0, usd_per_mtok_out: 0, "
                "base_url: 'http://127.0.0.1:1/v1', model: y}]\n"
            )
            done = run_cli("serve", "--config", str(config), "--port", "0")
            assert done.returncode == 2, done.stderr
            assert_refused_in_one_line_before_listening(done.stdout, done.stderr)
            assert "wrong-one" not in done.stderr
    finally:
        server.stop()


def test_the_cli_offers_every_demo_scenario():
    from tidegate.cli.main import _parser  # noqa: PLC0415 (the parser of the command under test)
    from tidegate.cli.scenarios import SCENARIOS  # noqa: PLC0415

    demo = next(
        a for a in _parser()._subparsers._group_actions[0].choices["demo"]._actions if a.dest == "scenario"
    )
    assert set(demo.choices) == set(SCENARIOS)


def test_demo_scenario_auth_wants_the_client_key():
    with CliProcess("demo", "--port", "0", "--scenario", "auth") as demo:
        assert 'api_key="demo-key"' in "".join(demo.output)
        refused = httpx.post(demo.url + "/chat/completions", json={"model": "demo-model", "messages": []})
        client = openai.OpenAI(base_url=demo.url, api_key="demo-key", max_retries=0)
        served = client.chat.completions.create(
            model="demo-model", messages=[{"role": "user", "content": "hi"}]
        )
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert served.choices[0].message.content


def test_demo_scenario_tight_answers_no_capacity_while_its_one_slot_is_busy():
    with CliProcess("demo", "--port", "0", "--scenario", "tight") as demo:
        body = {
            "model": "demo-model",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 400,
            "stream": True,
            "ignore_eos": True,
        }
        with httpx.stream("POST", demo.url + "/chat/completions", json=body, timeout=30) as holding:
            chunks = holding.iter_bytes()  # kept: a dropped iterator closes the stream
            first = next(chunks)  # the slot is taken once the stream has started
            second = httpx.post(demo.url + "/chat/completions", json={**body, "stream": False}, timeout=30)
    assert first
    assert second.status_code == 503 and second.headers["retry-after"] == "1"
    assert second.json()["error"]["code"] == "no_capacity"


def test_demo_scenario_faults_serves_through_its_faults_and_loses_nothing():
    with CliProcess("demo", "--port", "0", "--scenario", "faults") as demo:
        client = openai.OpenAI(base_url=demo.url, api_key="unused", max_retries=0, timeout=60)
        outcomes = []
        for _ in range(12):
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model="demo-model", messages=[{"role": "user", "content": "hi"}], max_tokens=5
                )
                outcomes.append(raw.headers["x-tidegate-outcome"])
            except openai.APIStatusError as exc:  # a clean OpenAI error is an answer too
                outcomes.append(exc.response.headers.get("x-tidegate-outcome", "error"))
    assert len(outcomes) == 12
    assert {"failed_over_ok", "retried_ok"} & set(outcomes), outcomes
