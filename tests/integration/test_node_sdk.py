"""openai-node 5.x against the gateway (in front of the simulator): `runTools` (a tool call,
its result, then the answer), `responses.stream`, and `embeddings.create` with the SDK's
default encoding (base64). Needs node and npm; skipped, saying so, where they are absent.
The SDK is installed once per machine into ~/.cache/tidegate-node (npm, from the registry)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from router.app import create_app
from tests.conftest import gateway_config, serverless_profile
from tests.servers import Sim, ThreadServer
from tidegate.sim.profile import Faults

HERE = Path(__file__).resolve().parent / "node"
CACHE = Path.home() / ".cache" / "tidegate-node"


def node_sdk() -> Path:
    """A directory holding sdk_check.mjs next to an installed openai-node."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not on this machine: the openai-node check is skipped")
    CACHE.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "sdk_check.mjs", "refusals.mjs"):
        shutil.copyfile(HERE / name, CACHE / name)
    wanted = json.loads((HERE / "package.json").read_text())["dependencies"]
    if not all((CACHE / "node_modules" / name / "package.json").exists() for name in wanted):
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--silent"],
            check=False,
            cwd=CACHE,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            pytest.skip(f"npm could not install openai-node (no registry?): {done.stderr[-300:]}")
    return CACHE


def test_openai_node_helpers_through_the_gateway():
    where = node_sdk()
    with Sim(serverless_profile()) as sl, ThreadServer(create_app(gateway_config(None, [sl]))) as gw:
        command = ["node", "sdk_check.mjs", gw.url + "/v1"]
        done = subprocess.run(command, check=False, cwd=where, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["toolArgs"]["city"] and found["runToolsCalls"] == 2 and found["runToolsAnswer"]
    assert (
        found["responsesEvents"][0] == "response.created"
        and found["responsesEvents"][-1] == "response.incomplete"  # max_output_tokens 5 cut it
    )
    assert found["responsesText"]
    assert found["embeddingLengths"] == [6, 6] and found["embeddingIsNumbers"]


def run_node(where: Path, *args: str) -> dict[str, object]:
    done = subprocess.run(
        ["node", *args], check=False, cwd=where, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_openai_node_reads_the_413_of_an_oversized_body_instead_of_a_connection_error():
    where = node_sdk()
    with Sim(serverless_profile()) as sl, ThreadServer(create_app(gateway_config(None, [sl]))) as gw:
        found = run_node(where, "refusals.mjs", gw.url + "/v1", "big")
        upstream_hits = sl.stats()["requests"]
    assert found["big"] == {"name": "APIError", "status": 413, "code": "request_too_large"}
    assert upstream_hits == 0


def test_the_ai_sdk_responses_model_reports_the_gateways_message_when_a_stream_is_cut():
    where = node_sdk()
    cutting = serverless_profile(faults=Faults(cut_rate=1.0))
    with Sim(cutting) as sl, ThreadServer(create_app(gateway_config(None, [sl]))) as gw:
        found = run_node(where, "refusals.mjs", gw.url + "/v1", "responses")
    errors = found["errors"]
    assert isinstance(errors, list) and errors
    assert all("validation" not in e.lower() for e in errors)
    assert any("stream interrupted" in e for e in errors)
