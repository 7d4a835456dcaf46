"""`tidegate replay` from outside (issue 17, the replay half): an open-loop replay of the
Azure code trace's first 15 s through `tidegate serve` in front of simulators."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.servers import CliProcess, Sim, run_cli
from tidegate.offline.replay import load, window
from tidegate.sim.profile import SERVERLESS_PRESETS, Kind, SimProfile

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "AzureLLMInferenceTrace_code_20min.csv"


@pytest.mark.timeout(120)
def test_a_replay_sends_every_row_on_time_with_its_sizes_and_reports_the_slo(tmp_path):
    dedicated = SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=8, itl_s=0.005, seed=1)
    serverless = SimProfile(
        kind=Kind.SERVERLESS, name="sl", ttft=SERVERLESS_PRESETS["fast"], serverless_itl_s=0.003
    )
    rows = window(load(TRACE), 0, 0.25)
    with Sim(dedicated) as ded, Sim(serverless) as sl:
        config = tmp_path / "g.yaml"
        config.write_text(
            "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
            f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded.base_url}', model: d, max_concurrency: 4}}]\n"
            f"    serverless: [{{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl.base_url}', model: s}}]\n"
        )
        with CliProcess("serve", "--config", str(config), "--port", "0") as gw:
            done = run_cli(
                "replay",
                str(TRACE),
                "--url",
                gw.url,
                "--model",
                "m",
                "--minutes",
                "0.25",
                "--slo-ttft-ms",
                "2000",
                "--out",
                str(tmp_path / "out"),
            )
        prompt_tokens = ded.stats()["usage_prompt_tokens"] + sl.stats()["usage_prompt_tokens"]
    assert done.returncode == 0, done.stdout + done.stderr
    found = orjson.loads((tmp_path / "out" / "replay.json").read_bytes())
    assert found["requests"] == len(rows) > 10
    assert found["client_kept_up"] and found["send_lag_ms"]["p99"] <= 50, found["send_lag_ms"]
    assert found["succeeded"] == len(rows)
    assert prompt_tokens == sum(r.input_tokens for r in rows)  # the sizes reached the simulators
    assert 0 < found["slo_attainment"] <= 1
    assert set(found["routes"]) <= {"ded", "sl"} and sum(found["routes"].values()) == len(rows)
    lines = (tmp_path / "out" / "requests.jsonl").read_bytes().splitlines()
    assert len(lines) == len(rows)
    assert all(orjson.loads(line)["lag_ms"] >= 0 for line in lines)
    assert "SLO (TTFT <= 2000 ms) met by" in done.stdout
