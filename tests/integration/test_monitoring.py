"""The shipped dashboard and alert rules against real parts: `promtool check rules` and
`promtool test rules` (tests/monitoring/), then a real Prometheus (Debian's package) scraping a
`tidegate serve` under a little traffic, where every dashboard query and every side of every
alert expression returns data, the alerts the traffic provokes evaluate to a firing series, and
no query names a series the gateway does not export."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from policies.canary import bucket
from tests.conftest import dedicated_profile, serverless_profile
from tests.servers import CliProcess, Sim, free_port_iter, wait_until

ROOT = Path(__file__).parents[2]
FILES = ROOT / "helm" / "tidegate" / "files"
DASHBOARD = FILES / "tidegate-dashboard.json"
RULES = FILES / "tidegate-alerts.yaml"
RULE_TESTS = ROOT / "tests" / "monitoring" / "tidegate-alerts-test.yaml"
ADMIN = {"authorization": "Bearer adm"}
# the alerts the traffic below provokes: a dead route's breaker, a key past its day budget, and
# a TTFT over a 1 ms SLO
PROVOKED = {"TidegateCircuitOpen", "TidegateBudgetNearlySpent", "TidegateTTFTSLOBreached"}
_COMPARISON = re.compile(r"\s(?:>|<|==|!=|>=|<=)\s(?:on\s*\([^)]*\)\s*group_left\s*\([^)]*\)\s*)?")
_SERIES = re.compile(r"\btidegate_[a-z0-9_]+")



@pytest.fixture(autouse=True)
def _prometheus_installed() -> None:
    """A real part the checks need: missing is a failure, not a skip (scripts/test installs it)."""
    missing = [tool for tool in ("promtool", "prometheus") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: scripts/test installs Debian's prometheus package")


def dashboard_queries() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(panel["title"], target["expr"]) for panel in panels for target in panel["targets"]]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def sides(expr: str) -> list[str]:
    """The expressions an alert compares (a number is not one): each must return data."""
    found = [part.strip() for part in _COMPARISON.split(" ".join(expr.split()))]
    return [part for part in found if not re.fullmatch(r"[\d.]+", part)]


def test_promtool_checks_and_unit_tests_the_rules():
    checked = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], check=False, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout
    tested = subprocess.run(
        ["promtool", "test", "rules", RULE_TESTS.name],
        check=False,
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    tested_alerts = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert tested_alerts == {rule["alert"] for rule in alert_rules()}  # every alert has a unit test


def test_the_dashboard_is_grafana_json_covering_the_operators_questions():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "tidegate" and dashboard["schemaVersion"] >= 36
    titles = " ".join(panel["title"] for panel in dashboard["panels"]).lower()
    for wanted in ("route", "spill", "ttft", "cv%", "cost per successful task", "utilization",
                   "canary", "breaker", "tenants", "refusal", "state store"):  # fmt: skip
        assert wanted in titles, wanted
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"])
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def gateway_config(path: Path, ded: Sim, sl: Sim) -> Path:
    dead = f"http://127.0.0.1:{next(free_port_iter())}/v1"  # nothing listens: its breaker opens
    path.write_text(
        "auth:\n  api_keys: [plain]\n  admin_key: adm\n  keys:\n"
        "    - {name: alpha, team: bi, key: '${ALPHA_KEY}', max_usd_per_day: 0.000001}\n"
        "    - {name: beta, team: web, key: '${BETA_KEY}', rpm: 1}\n"
        "models:\n  m:\n    canary_percent: 50\n"
        "    slo: {ttft_p95_ms: 1}\n"
        "    breaker: {consecutive_failures: 1, cooldown_s: 60, max_cooldown_s: 60}\n"
        "    retry: {attempts: 3, backoff_ms: 1, budget_percent: 100}\n"
        "    canary: {start: auto, steps: [50, 100], interval_s: 1, min_samples: 1}\n"
        f"    dedicated: [{{name: ded, gpu_hour_usd: 4.41, base_url: '{ded.base_url}', model: d, max_concurrency: 8}}]\n"
        "    serverless:\n"
        f"      - {{name: dead, usd_per_mtok_in: 1, usd_per_mtok_out: 1, base_url: '{dead}', model: s}}\n"
        f"      - {{name: sl, usd_per_mtok_in: 100, usd_per_mtok_out: 100, base_url: '{sl.base_url}', model: s}}\n"
    )
    return path


def outside_the_canary(count: int) -> list[str]:
    """`user` values whose requests go to serverless (as canary_out) at a 50% canary."""
    return [u for u in (f"user-{i}" for i in range(50 * count)) if bucket("m", u) >= 50][:count]


def send_plain_traffic(url: str) -> None:
    plain = openai.OpenAI(base_url=url, api_key="plain", max_retries=0, timeout=30)
    for i in range(30):  # both sides, streamed (TTFT) and not
        answer = plain.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=i % 2 == 0, user=f"u{i}", max_tokens=8
        )
        if i % 2 == 0:
            for _ in answer:
                pass


def send_keyed_traffic(url: str) -> None:
    for client_key, requests in (("alpha-secret", 3), ("beta-secret", 2)):  # past the budget; over rpm
        client = openai.OpenAI(base_url=url, api_key=client_key, max_retries=0, timeout=30)
        for user in outside_the_canary(requests):
            try:
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi " * 50}], user=user, max_tokens=50
                )
            except openai.APIStatusError as exc:
                assert exc.status_code == 429, exc  # refused by the key's limits: what is counted
            time.sleep(0.3)  # the spend settles after the answer; the next admission reads it


class Prometheus:
    """A real Prometheus on a free loopback port, scraping `targets` every second with the
    shipped rules loaded; ended by its PID."""

    def __init__(self, workdir: Path, targets: list[str]) -> None:
        self.port = next(free_port_iter())
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "tidegate", "static_configs": [{"targets": targets}]}],
        }
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.args = [
            "prometheus",
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._ready, timeout=60)
        return self

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10).json()
        assert answer["status"] == "success", (expr, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def __exit__(self, *_: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[CliProcess]:
    with (
        Sim(dedicated_profile(max_concurrency=8)) as ded,
        Sim(serverless_profile()) as sl,
        CliProcess(
            "serve",
            "--config",
            str(gateway_config(tmp_path / "gw.yaml", ded, sl)),
            "--port",
            "0",
            env={"ALPHA_KEY": "alpha-secret", "BETA_KEY": "beta-secret"},
        ) as gw,
    ):
        yield gw


@pytest.mark.timeout(240)
def test_every_dashboard_query_and_alert_expression_returns_data_from_a_real_prometheus(gateway, tmp_path):
    host_port = gateway.root.removeprefix("http://")
    with Prometheus(tmp_path / "prometheus", [host_port]) as prometheus:
        wait_until(lambda: prometheus.query("up == 1") != [], timeout=60, interval=0.5)  # scraping
        # a series is born at its first value, which rate() cannot see rise: a first wave makes
        # the series, and once Prometheus has them, a second wave moves them
        send_plain_traffic(gateway.url)
        wait_until(lambda: prometheus.query("tidegate_ttft_seconds_count") != [], timeout=60, interval=0.5)
        send_plain_traffic(gateway.url)
        send_keyed_traffic(gateway.url)
        check_every_query(prometheus, gateway)
        loaded = httpx.get(prometheus.url + "/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = alert_rules()
    assert sorted(r["name"] for g in loaded for r in g["rules"]) == sorted(r["alert"] for r in rules)
    assert all(r["health"] == "ok" for g in loaded for r in g["rules"])


def check_every_query(prometheus: Prometheus, gateway: CliProcess) -> None:
    exported = {
        line.split("{")[0].split(" ")[0]
        for line in httpx.get(gateway.root + "/metrics", timeout=10).text.splitlines()
        if line and not line.startswith("#")
    }
    queries = dashboard_queries()
    rules = alert_rules()
    named = {name for _, expr in queries for name in _SERIES.findall(expr)}
    named |= {name for rule in rules for name in _SERIES.findall(rule["expr"])}
    assert named - exported == set(), "queries name series the gateway does not export"
    pending: dict[str, str] = {title + ": " + expr: expr for title, expr in queries}
    pending |= {f"{rule['alert']} side: {side}": side for rule in rules for side in sides(rule["expr"])}
    pending |= {f"{rule['alert']} fires": rule["expr"] for rule in rules if rule["alert"] in PROVOKED}

    def all_answer() -> bool:
        for name, expr in list(pending.items()):
            if prometheus.query(expr):
                del pending[name]
        return not pending

    try:
        wait_until(all_answer, timeout=90, interval=1)
    except AssertionError:
        shown = {side: prometheus.query(side) for expr in pending.values() for side in sides(expr)}
        pytest.fail(f"no data from a real Prometheus for: {sorted(pending)}; their sides: {shown}")
