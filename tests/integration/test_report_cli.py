"""`tidegate report` from outside, as an operator runs it after `tidegate demo` traffic: the
table, the JSON and the HTML page with its plots; and the economics on /metrics."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import openai
import orjson

from tests.servers import CliProcess, run_cli, wait_until

ADMIN = ("--admin-key", "demo-admin")


def test_report_after_demo_traffic(tmp_path):
    launched = time.time()
    with CliProcess("demo", "--port", "0") as demo:
        client = openai.OpenAI(base_url=demo.url, api_key="unused", max_retries=0)
        for i in range(6):
            client.chat.completions.create(
                model="demo-model",
                messages=[{"role": "user", "content": f"Hello {i}"}],
                stream=i % 2 == 0,
                max_tokens=8,
            )
        report_url = demo.root + "/admin/report?window=5m"
        admin = {"authorization": "Bearer demo-admin"}
        wait_until(
            lambda: (
                httpx.get(report_url, headers=admin).json()["models"]["demo-model"]["economics"]["blended"][
                    "tasks"
                ]
                == 6
            ),
            timeout=10,
        )
        table = run_cli("report", "--url", demo.root, *ADMIN, "--window", "5m")
        as_json = run_cli("report", "--url", demo.root, *ADMIN, "--window", "5m", "--format", "json")
        out = tmp_path / "report"
        page = run_cli(
            "report", "--url", demo.root, *ADMIN, "--window", "5m", "--format", "html", "--out", str(out)
        )
        bad_window = run_cli("report", "--url", demo.root, *ADMIN, "--window", "soon")
        metrics = httpx.get(demo.root + "/metrics").text
        age_s = time.time() - launched
    assert table.returncode == 0, table.stderr
    assert "demo-model: cost over the last 300s" in table.stdout and "blended" in table.stdout
    assert "→" in table.stdout  # the recommendation
    found = orjson.loads(as_json.stdout)
    economics = found["models"]["demo-model"]["economics"]
    assert economics["blended"]["tasks"] == 6
    assert economics["routes"]["sim-dedicated"]["cost_usd"] > 0  # provisioned time is paid, busy or idle
    # ... but only since the demo started, not for the 5 minutes before it existed
    assert economics["routes"]["sim-dedicated"]["replica_hours"] * 3600 <= age_s + 1
    assert found["models"]["demo-model"]["traffic_shape"]["requests"] == 6
    tokens = found["models"]["demo-model"]["traffic_shape"]["token_distribution"]
    assert tokens["output"]["answers"] == 6 and tokens["output"]["p50"] > 0
    assert tokens["input"]["p95"] >= tokens["input"]["p50"] > 0
    assert page.returncode == 0, page.stderr
    for name in ("concurrency", "cost", "ttft", "utilization"):
        assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG"), name
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == 4
    assert orjson.loads((out / "report.json").read_bytes())["window_s"] == 300
    assert bad_window.returncode == 1 and "window" in bad_window.stderr
    assert 'tidegate_tasks_total{model="demo-model"' in metrics
    assert "tidegate_cost_usd_total" in metrics
    assert 'tidegate_dedicated_utilization{endpoint="sim-dedicated"}' in metrics
    assert 'tidegate_dedicated_desired_replicas{endpoint="sim-dedicated"}' in metrics


def test_plan_from_a_running_gateway_takes_each_hours_volume_from_its_rollups(tmp_path):
    """`tidegate plan TRACE --from URL --schedule`: the hours planned are the gateway's, from
    its first hour with traffic; a window beyond its retention is refused by name."""
    source = Path(__file__).resolve().parents[1] / "data" / "traces" / "AzureLLMInferenceTrace_code_20min.csv"
    with CliProcess("demo", "--port", "0") as demo:
        client = openai.OpenAI(base_url=demo.url, api_key="unused", max_retries=0)
        for i in range(5):
            client.chat.completions.create(
                model="demo-model", messages=[{"role": "user", "content": f"Hi {i}"}], max_tokens=4
            )
        first_hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0, tzinfo=None)
        report_url = demo.root + "/admin/report?window=5m"
        admin = {"authorization": "Bearer demo-admin"}
        wait_until(
            lambda: (
                httpx.get(report_url, headers=admin).json()["models"]["demo-model"]["traffic_shape"][
                    "requests"
                ]
                == 5
            ),
            timeout=10,
        )
        plan = ("plan", str(source), "--from", demo.root, *ADMIN, "--model", "demo-model")
        out = tmp_path / "plan"
        done = run_cli(*plan, "--window", "1h", "--schedule", "--replicas", "0", "1", "--out", str(out))
        too_far = run_cli(*plan, "--window", "30d", "--schedule", "--out", str(tmp_path / "x"))
    assert done.returncode == 0, done.stdout + done.stderr
    found = orjson.loads((out / "schedule.json").read_bytes())
    started = datetime.fromisoformat(found["trace"]["start"])
    assert started in (first_hour, first_hour - timedelta(hours=1))  # the window's first hour with traffic
    assert found["trace"]["requests"] > 0 and len(found["week"]) == 168
    assert too_far.returncode == 2 and "retention_s" in too_far.stderr
