"""`tidegate plan` from outside, and the model against a replay of the same plan through a real
`tidegate serve` in front of `tidegate sim` processes (issue 17; bench/plan_vs_replay.py runs
the full table)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from bench.plan_vs_replay import Slice, compare
from tests.servers import CliProcess, Sim, run_cli
from tidegate.offline.planner.model import Plan
from tidegate.sim.profile import SERVERLESS_PRESETS, Kind, SimProfile

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "AzureLLMInferenceTrace_code_20min.csv"


def test_plan_sweeps_the_grid_marks_the_cheapest_plan_meeting_the_slo_and_writes_its_outputs(tmp_path):
    done = run_cli(
        "plan", str(TRACE), "--minutes", "3", "--replicas", "0", "1", "2", "--max-concurrency", "16", "64",
        "--max-queue-ms", "0", "500", "--canary", "100", "--price-sweep", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    found = orjson.loads((tmp_path / "plan.json").read_bytes())
    # per keep-warm setting (off, 30 s): all-serverless, and per replica count 2 slot counts x
    # 2 waits plus predicted-TTFT admission at the SLO and 3/4 of it, up to the engine's 1,024
    assert len(found["plans"]) == 2 * (1 + 2 * (2 * 2 + 2))
    budgets = {p["settings"]["ttft_budget_ms"] for p in found["plans"] if p["settings"]["admission"] == "predicted_ttft"}
    assert budgets == {2000.0, 1500.0}
    assert {p["settings"]["max_concurrency"] for p in found["plans"] if p["settings"]["admission"] == "predicted_ttft"} == {1024}
    dedicated_plans = [p for p in found["plans"] if p["settings"]["replicas"] > 0]
    assert {p["settings"]["admission"] for p in dedicated_plans} == {"slots", "predicted_ttft"}
    assert {p["settings"]["keep_warm_s"] for p in found["plans"]} == {0.0, 30.0}
    labels = {p["plan"] for p in found["plans"]}
    assert found["chosen"] in labels and found["runner_up"] in labels
    chosen = next(p for p in found["plans"] if p["plan"] == found["chosen"])
    meeting = [p for p in found["plans"] if p["slo_attainment"] >= 0.95]
    assert chosen["cost_per_slo_success_usd"] == min(p["cost_per_slo_success_usd"] for p in meeting)
    assert found["chosen"] in found["pareto"] and set(found["pareto"]) <= labels
    dedicated = [p for p in found["plans"] if p["settings"]["replicas"] > 0]
    assert all(p["break_even"]["gpu_hour_usd"] is not None for p in dedicated)
    assert all(0 <= p["dedicated_utilization"] <= 1 for p in dedicated)
    assert (tmp_path / "pareto.png").read_bytes().startswith(b"\x89PNG")
    assert f"cheapest plan meeting the SLO: {found['chosen']}" in done.stdout
    assert "wins below $/GPU-h" in done.stdout


def test_a_long_trace_is_planned_on_a_sample_that_says_what_it_stands_for(tmp_path):
    grid = ("--replicas", "0", "1", "--max-concurrency", "16", "--max-queue-ms", "0", "--canary", "100")
    runs = {}
    for sampling in ("on", "off"):
        out = tmp_path / sampling
        done = run_cli(
            "plan", str(TRACE.with_name("AzureLLMInferenceTrace_conv_20min.csv")), *grid, "--sampling", sampling, "--slice-s", "60", "--slices-per-stratum", "1",
            "--jobs", "1", "--out", str(out),
        )  # fmt: skip
        assert done.returncode in {0, 1}, done.stdout + done.stderr
        runs[sampling] = orjson.loads((out / "plan.json").read_bytes())
    sampled, exact = runs["on"], runs["off"]
    shape = sampled["trace"]["sampled"]
    assert shape["slices"] < shape["of_slices"] == 20 and shape["of_requests"] == exact["trace"]["requests"]
    assert exact["trace"]["sampled"] is None and all("sampled" not in p for p in exact["plans"])
    for estimated, modelled in zip(sampled["plans"], exact["plans"], strict=True):
        assert estimated["plan"] == modelled["plan"] and estimated["sampled"] == shape
        assert estimated["requests"] == pytest.approx(modelled["requests"], abs=1)  # the weights add up
        assert estimated["dedicated_usd"] == modelled["dedicated_usd"]  # by the span: exact


def test_plan_refuses_bad_input_with_a_clear_error(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    for args, message in (
        ((str(empty),), "no rows"),
        ((str(TRACE), "--config", str(tmp_path / "missing.yaml")), "cannot read"),
        ((str(TRACE), "--price-sweep", "--replicas", "1"), "keep 0 in --replicas"),
        ((str(TRACE), "--slice-s", "0"), "--slice-s must be > 0"),
        ((str(TRACE), "--slices-per-stratum", "0"), "--slices-per-stratum >= 1"),
    ):
        done = run_cli("plan", *args, "--minutes", "1", "--out", str(tmp_path / "out"))
        assert done.returncode == 2, done.stdout + done.stderr
        assert message in done.stdout + done.stderr


def test_a_replay_at_a_speed_the_gateway_was_not_time_lapsed_for_is_refused(tmp_path):
    serverless = SimProfile(kind=Kind.SERVERLESS, name="sl", ttft=SERVERLESS_PRESETS["fast"])
    with Sim(serverless) as sl:
        config = tmp_path / "g.yaml"
        config.write_text(
            "auth: {allow_anonymous: true}\nstate: {window_s: 40}\nmodels:\n  m:\n"
            f"    serverless: [{{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl.base_url}', model: s}}]\n"
        )
        scaled = run_cli("replay", "--scale-config", str(config), "--speed", "4")
        assert scaled.returncode == 0, scaled.stderr
        assert yaml.safe_load(scaled.stdout)["time_scale"] == 4
        lapsed = tmp_path / "g4.yaml"
        lapsed.write_text(scaled.stdout)
        replay = ("replay", str(TRACE), "--model", "m", "--minutes", "0.05", "--out", str(tmp_path / "o"))
        with CliProcess("serve", "--config", str(config), "--port", "0") as gw:
            refused = run_cli(*replay, "--url", gw.url, "--speed", "4")
        assert refused.returncode == 2 and "time_scale 1" in refused.stdout + refused.stderr
        with CliProcess("serve", "--config", str(lapsed), "--port", "0") as gw:
            accepted = run_cli(*replay, "--url", gw.url, "--speed", "4", "--config", str(config))
        assert accepted.returncode == 0, accepted.stdout + accepted.stderr
        assert "per SLO-successful task" in accepted.stdout
    too_fast = run_cli("replay", "--scale-config", str(config), "--speed", "8")
    assert too_fast.returncode == 2 and "state.window_s" in too_fast.stdout + too_fast.stderr


@pytest.mark.timing  # the replay measures TTFTs: alone, so other tests do not slow it
@pytest.mark.timeout(300)
def test_the_model_predicts_what_a_replay_through_the_real_gateway_measures(tmp_path):
    """Minute 3 of the code trace (531 requests of ~2,000 prompt tokens in one burst) at x4,
    on one dedicated replica with 16 slots: both routes serve, a third of it spilled."""
    found = compare(Slice("code", TRACE, 3, 1), Plan(1, 16), 4, tmp_path)
    measured, predicted = found.measured, found.predicted
    assert measured["client_kept_up"], measured["send_lag_ms"]
    assert measured["succeeded"] == measured["requests"] == predicted["requests"] > 500
    assert abs(found.attainment_points) <= 3, (predicted["slo_attainment"], measured["slo_attainment"])
    assert abs(found.cost_ratio) <= 0.03, (predicted["cost_usd"], measured["cost_usd"])
    assert abs(found.p95_ratio) <= 0.15, (predicted["ttft_ms"], measured["ttft_ms"])
    assert 0.1 < measured["spill_share"] < 0.9  # both routes were exercised


def test_plan_calibrates_its_model_from_a_running_gateways_route_figures(tmp_path):
    import openai  # noqa: PLC0415

    from router.app import create_app  # noqa: PLC0415
    from router.config import parse_config  # noqa: PLC0415
    from tests.servers import ThreadServer  # noqa: PLC0415

    admin = "a" * 32
    dedicated = SimProfile(kind=Kind.DEDICATED, name="d", prefill_tokens_per_s=20_000, itl_s=0.004, seed=1)
    serverless = SimProfile(kind=Kind.SERVERLESS, name="s", ttft=SERVERLESS_PRESETS["fast"], seed=2)
    with Sim(dedicated) as ded, Sim(serverless) as sl:
        config = parse_config(
            f"auth: {{allow_anonymous: true, admin_key: {admin}}}\nmodels:\n  m:\n"
            f"    dedicated: [{{name: d, gpu_hour_usd: 0, base_url: '{ded.base_url}', model: d, max_concurrency: 1}}]\n"
            f"    serverless: [{{name: s, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl.base_url}', model: s}}]\n",
            {},
        )
        with ThreadServer(create_app(config)) as gateway:
            client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
            for _ in range(6):  # one at a time: dedicated has the slot, so every one lands there
                stream = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "x" * 8000}], max_tokens=4, stream=True
                )
                assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            done = run_cli(
                "plan", str(TRACE), "--minutes", "1", "--replicas", "0", "1", "--max-concurrency", "16",
                "--max-queue-ms", "0", "--canary", "100", "--calibrate", gateway.url, "--model", "m",
                "--admin-key", admin, "--out", str(tmp_path),
            )  # fmt: skip
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert "calibrated from" in done.stderr and "d: prefill" in done.stderr
    fitted = orjson.loads((tmp_path / "plan.json").read_bytes())["dedicated"]
    # ~2,000-token prompts in ~0.1 s of prefill: the fit is near the simulator's 20,000 tokens/s
    # (the calibration's 80 ms overhead is kept, so the fit reads the rest as prefill)
    assert fitted["prefill_tokens_per_s"] > 16_500 * 1.2
    assert fitted["itl_s"] < 0.0186  # the simulator's 4 ms steps, not the calibration's 18.6 ms
