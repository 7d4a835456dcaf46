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

HERE = Path(__file__).resolve().parent / "node"
CACHE = Path.home() / ".cache" / "tidegate-node"


def node_sdk() -> Path:
    """A directory holding sdk_check.mjs next to an installed openai-node."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not on this machine: the openai-node check is skipped")
    CACHE.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "sdk_check.mjs"):
        shutil.copyfile(HERE / name, CACHE / name)
    if not (CACHE / "node_modules" / "openai" / "package.json").exists():
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
        and found["responsesEvents"][-1] == "response.completed"
    )
    assert found["responsesText"]
    assert found["embeddingLengths"] == [6, 6] and found["embeddingIsNumbers"]
