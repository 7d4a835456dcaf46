"""Check the Helm chart offline: lint, render, and feed the rendered config to tidegate.

Runs in the Python 3.12 venv `.venv-helm` (made by scripts/helm_env): helm-sdkpy's Lint action
lints (the check the deployment issue asks for); helm-python-sdk's Chart.render renders the
templates, which helm-sdkpy cannot do without a cluster.

    .venv-helm/bin/python scripts/helm_check.py --tidegate .venv/bin/tidegate

Every check prints one line; any failure makes the exit status 1. Checks that must fail
(a broken template, values that break the schema, more than one replica without Redis)
count as passed only when Helm refuses them.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import helm_python
import helm_sdkpy
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "tidegate"
EXAMPLES = sorted((ROOT / "helm" / "examples").glob("*.yaml"))
_UNSET_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def chart_copy(
    workdir: Path, values: dict[str, Any] | None = None, edit: Callable[[Path], None] | None = None
) -> Path:
    """A copy of the chart with `values` merged into its values.yaml and `edit` applied."""
    target = Path(tempfile.mkdtemp(dir=workdir)) / "tidegate"
    shutil.copytree(CHART, target)
    if values is not None:
        defaults = yaml.safe_load((CHART / "values.yaml").read_text())
        (target / "values.yaml").write_text(yaml.safe_dump(deep_merge(defaults, values)))
    if edit is not None:
        edit(target)
    return target


_ERROR_SEVERITY = 3  # Helm's support.ErrorSev (1 info, 2 warning)


def lint(chart: Path) -> list[str]:
    """helm lint (helm-sdkpy); one entry per error-level message or failure. helm-sdkpy
    serialises a message's Go error as {}, so an entry names the file, not the cause.
    In lint mode Helm turns `fail` into a log line, so the chart's own refusals are checked
    by rendering (see `render_fails`)."""
    try:
        result = asyncio.run(helm_sdkpy.Lint(helm_sdkpy.Configuration()).run(str(chart)))
    except helm_sdkpy.HelmError as exc:
        return [str(exc)]
    messages = result.get("Messages") or []
    errors = [f"{m.get('Path')}: error" for m in messages if m.get("Severity", 0) >= _ERROR_SEVERITY]
    return errors + [str(e) for e in result.get("Errors") or []]


def render(chart: Path, values: dict[str, Any] | None = None) -> dict[str, str]:
    """The rendered manifests (helm-python-sdk), templates' .yaml files only."""
    with helm_python.Chart.load(str(chart)) as loaded:
        loaded.validate_schema(values or {})
        rendered = loaded.render(values or {}, name="tidegate", namespace="default", is_install=True)
    return {path: text for path, text in rendered.items() if path.endswith(".yaml")}


def render_fails(values: dict[str, Any], expect: str) -> str | None:
    """None when rendering with `values` is refused for a reason mentioning `expect`."""
    try:
        render(CHART, values)
    except helm_python.HelmError as exc:
        return None if expect.lower() in str(exc).lower() else f"refused, but not for {expect!r}: {exc}"
    return "helm rendered it"


def documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    return [d for text in rendered.values() for d in yaml.safe_load_all(text) if isinstance(d, dict)]


def find(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d.get("kind") == kind]
    return found


class Checks:
    def __init__(self) -> None:
        self.failed = 0

    def run(self, name: str, check: Callable[[], str | None]) -> None:
        try:
            problem = check()
        except Exception as exc:  # reported as this check's failure
            problem = f"{type(exc).__name__}: {exc}"
        print(f"{'ok  ' if problem is None else 'FAIL'} {name}{'' if problem is None else ': ' + problem}")
        self.failed += problem is not None


def check_config(tidegate: str, text: str, workdir: Path) -> str | None:
    """`tidegate check-config` on a rendered tidegate.yaml; secrets are placeholders."""
    path = workdir / "rendered-tidegate.yaml"
    path.write_text(text)
    env = {name: f"placeholder-{name}" for name in _UNSET_VAR.findall(text)}  # distinct, like real secrets
    done = subprocess.run(
        [tidegate, "check-config", str(path)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **env},
        timeout=60,
        check=False,
    )
    return None if done.returncode == 0 else (done.stdout + done.stderr).strip()


def lint_checks(checks: Checks, workdir: Path) -> None:
    def lints_clean(chart: Path) -> str | None:
        errors = lint(chart)
        return "; ".join(errors) if errors else None

    checks.run("lint: default values", lambda: lints_clean(CHART))
    for example in EXAMPLES:
        values = yaml.safe_load(example.read_text())
        checks.run(f"lint: {example.name}", lambda v=values: lints_clean(chart_copy(workdir, v)))


def example_config(tidegate: str, values: dict[str, Any], workdir: Path) -> str | None:
    docs = documents(render(CHART, values))
    spec = find(docs, "Deployment")["spec"]
    if values.get("autoscaling", {}).get("enabled"):
        find(docs, "HorizontalPodAutoscaler")
        if "replicas" in spec:
            return "replicas set although the autoscaler owns them"
    elif spec.get("replicas") != values.get("replicaCount", 1):
        return "replicaCount not rendered"
    return check_config(tidegate, find(docs, "ConfigMap")["data"]["tidegate.yaml"], workdir)


def rolls_on_config_change() -> str | None:
    other = {
        "other": {
            "serverless": [
                {
                    "name": "p",
                    "usd_per_mtok_in": 0,
                    "usd_per_mtok_out": 0,
                    "base_url": "https://p.example/v1",
                    "model": "x",
                }
            ]
        }
    }
    first = find(documents(render(CHART)), "Deployment")
    changed = find(documents(render(CHART, {"routes": other})), "Deployment")
    key = "checksum/config"
    a = first["spec"]["template"]["metadata"]["annotations"][key]
    b = changed["spec"]["template"]["metadata"]["annotations"][key]
    return None if a != b else "the config checksum did not change"


def drains_before_kill() -> str | None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    pod = find(documents(render(CHART)), "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    if pod["terminationGracePeriodSeconds"] <= values["drainSeconds"] + values["preStopSleepSeconds"]:
        return "grace period does not cover the drain"
    if "preStop" not in container["lifecycle"] or container["readinessProbe"]["httpGet"]["path"] != "/readyz":
        return "preStop pause or readiness probe missing"
    return None if "podAntiAffinity" in pod["affinity"] else "no pod anti-affinity"


def embedded_redis() -> str | None:
    docs = documents(render(CHART, {"replicaCount": 2, "redis": {"embedded": {"enabled": True}}}))
    container = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    if "StatefulSet" not in {d["kind"] for d in docs}:
        return "no Redis StatefulSet"
    return (
        None if env.get("TIDEGATE_REDIS_URL", "").startswith("redis://tidegate-redis:6379") else f"env {env}"
    )


def keda_for_dedicated_pools() -> str | None:
    if any(d.get("kind") == "ScaledObject" for d in documents(render(CHART))):
        return "a ScaledObject rendered with dedicatedAutoscaling off"
    values = {
        "dedicatedAutoscaling": {
            "enabled": True,
            "prometheusServerAddress": "http://prometheus:9090",
            "pools": [{"endpoint": "vllm_a", "deployment": "vllm-a", "maxReplicas": 4}],
        }
    }
    scaled = find(documents(render(CHART, values)), "ScaledObject")
    trigger = scaled["spec"]["triggers"][0]["metadata"]
    if trigger["query"] != 'max(tidegate_dedicated_desired_replicas{endpoint="vllm_a"})':
        return f"query {trigger['query']!r}"
    target = scaled["spec"]["scaleTargetRef"]["name"]
    return None if target == "vllm-a" and scaled["spec"]["maxReplicaCount"] == 4 else f"spec {scaled['spec']}"


def dns_pool_wiring() -> str | None:
    """A pool found by DNS: its headless Service publishes only Ready pods, the discovery
    settings reach the config, and KEDA may not scale past the pool's max_replicas."""
    values = yaml.safe_load((ROOT / "helm" / "examples" / "dns-pool-values.yaml").read_text())
    docs = documents(render(CHART, values))
    (service,) = [d for d in docs if d.get("kind") == "Service" and d["spec"].get("clusterIP") == "None"]
    spec = service["spec"]
    if spec["publishNotReadyAddresses"] or spec["selector"] != {"app": "vllm-llama"}:
        return f"headless Service {spec}"
    config = yaml.safe_load(find(docs, "ConfigMap")["data"]["tidegate.yaml"])
    if config.get("discovery") != {"refresh_s": 1.0, "forget_after_s": 10.0}:
        return f"discovery rendered as {config.get('discovery')}"
    too_many = copy.deepcopy(values)
    too_many["dedicatedAutoscaling"]["pools"][0]["maxReplicas"] = 9
    return render_fails(too_many, "exceeds routes.llama-8b.dedicated[vllm].max_replicas")


def trusted_proxies() -> str | None:
    def believed(values: dict[str, Any] | None) -> Any:
        text = find(documents(render(CHART, values)), "ConfigMap")["data"]["tidegate.yaml"]
        return yaml.safe_load(text)["server"]["forwarded_allow_ips"]

    default, set_ = believed(None), believed({"trustedProxies": ["10.42.0.0/16"]})
    if default != []:
        return f"X-Forwarded-For believed by default from {default}"
    return None if set_ == ["10.42.0.0/16"] else f"trustedProxies rendered as {set_}"


def monitoring_ships_the_files() -> str | None:
    """Off by default; on, the dashboard ConfigMap and the PrometheusRule carry the chart's
    files/ unchanged (the plain files make test checks against promtool and Prometheus)."""
    kinds = {d.get("kind") for d in documents(render(CHART))}
    if "PrometheusRule" in kinds or any(
        d.get("kind") == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
        for d in documents(render(CHART))
    ):
        return "monitoring rendered while off"
    on = {"monitoring": {"dashboard": {"enabled": True}, "rules": {"enabled": True}}}
    docs = documents(render(CHART, on))
    dashboard = next(
        d for d in docs if d.get("kind") == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    )
    shipped = json.loads(dashboard["data"]["tidegate-dashboard.json"])
    if shipped != json.loads((CHART / "files" / "tidegate-dashboard.json").read_text()):
        return "the dashboard ConfigMap differs from files/tidegate-dashboard.json"
    if dashboard["metadata"]["labels"].get("grafana_dashboard") != "1":
        return f"dashboard labels {dashboard['metadata']['labels']}"
    rule = find(docs, "PrometheusRule")
    plain = yaml.safe_load((CHART / "files" / "tidegate-alerts.yaml").read_text())
    return None if rule["spec"] == plain else "the PrometheusRule differs from files/tidegate-alerts.yaml"


def render_checks(checks: Checks, tidegate: str, workdir: Path) -> None:
    def default_config() -> str | None:
        configmap = find(documents(render(CHART)), "ConfigMap")
        return check_config(tidegate, configmap["data"]["tidegate.yaml"], workdir)

    checks.run("render: default routes pass tidegate check-config", default_config)
    for example in EXAMPLES:
        values = yaml.safe_load(example.read_text())
        checks.run(
            f"render: {example.name} config passes tidegate check-config",
            lambda v=values: example_config(tidegate, v, workdir),
        )
    checks.run("render: a routes change changes the pod template (pods roll)", rolls_on_config_change)
    checks.run("render: drain fits the grace period; preStop, probes, anti-affinity", drains_before_kill)
    checks.run("render: redis.embedded deploys one Redis and points the gateway at it", embedded_redis)
    checks.run(
        "render: dedicatedAutoscaling renders a KEDA ScaledObject per pool (off by default)",
        keda_for_dedicated_pools,
    )
    checks.run(
        "render: a DNS pool's headless Service, discovery settings, and KEDA within max_replicas",
        dns_pool_wiring,
    )
    checks.run(
        "render: X-Forwarded-For is believed only from trustedProxies (none by default)", trusted_proxies
    )
    checks.run(
        "render: monitoring ships the dashboard and alert rules files unchanged (off by default)",
        monitoring_ships_the_files,
    )


def refusal_checks(checks: Checks, tidegate: str, workdir: Path) -> None:
    def refused(chart: Path) -> str | None:
        return None if lint(chart) else "helm lint accepted it"

    def broken_template(chart: Path) -> None:
        with (chart / "templates" / "service.yaml").open("a") as f:
            f.write("\n{{ if .Values.service.port }}\n")  # an unclosed action

    def rejected_by_tidegate() -> str | None:
        twice = {
            "name": "p",
            "usd_per_mtok_in": 0,
            "usd_per_mtok_out": 0,
            "base_url": "https://p.example/v1",
            "model": "x",
        }
        configmap = find(
            documents(render(CHART, {"routes": {"m": {"serverless": [twice, twice]}}})), "ConfigMap"
        )
        problem = check_config(tidegate, configmap["data"]["tidegate.yaml"], workdir)
        return None if problem and "used twice" in problem else f"check-config said: {problem}"

    bad_values = {"replicaCount": "three", "redis": {"url": "http://nope"}}
    checks.run("must fail: a broken template", lambda: refused(chart_copy(workdir, edit=broken_template)))
    checks.run(
        "must fail: lint of values that break the schema", lambda: refused(chart_copy(workdir, bad_values))
    )
    checks.run(
        "must fail: rendering values that break the schema", lambda: render_fails(bad_values, "replicaCount")
    )
    checks.run(
        "must fail: two replicas with no Redis", lambda: render_fails({"replicaCount": 2}, "needs Redis")
    )
    checks.run(
        "must fail: a grace period shorter than the drain",
        lambda: render_fails({"drainSeconds": 60, "terminationGracePeriodSeconds": 30}, "must exceed"),
    )
    checks.run("must fail: routes tidegate rejects (an endpoint name used twice)", rejected_by_tidegate)
    plain = {"auth": {"keys": [{"name": "app", "key": "sk-written-in-values"}]}}
    checks.run("must fail: a named key's secret written in values", lambda: render_fails(plain, "key"))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tidegate", required=True, help="the tidegate CLI to run check-config with")
    args = parser.parse_args()
    checks = Checks()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        lint_checks(checks, workdir)
        render_checks(checks, args.tidegate, workdir)
        refusal_checks(checks, args.tidegate, workdir)
    print(f"helm checks: {checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
