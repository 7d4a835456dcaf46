"""The retry interplay with the official openai SDK, its default retries on (2 more tries on
429/5xx, honouring Retry-After and x-should-retry): an SDK call reaches the upstreams at most
`retry.attempts` times, and an upstream's Retry-After is waited out by the gateway only."""

from __future__ import annotations

import openai
import pytest

from router.app import create_app
from tests.conftest import gateway_config, serverless_profile
from tests.servers import Sim, ThreadServer
from tidegate.sim.profile import Faults


@pytest.mark.parametrize(
    "faults",
    [
        Faults(error_rate=1.0),  # 500/503 every time
        Faults(rate_limit_rate=1.0, retry_after_s=0.2),  # 429 + Retry-After every time
    ],
    ids=["5xx", "429"],
)
def test_an_sdk_call_reaches_the_upstream_at_most_retry_attempts_times(faults):
    with Sim(serverless_profile(faults=faults)) as sl:
        config = gateway_config(None, [sl], retry="{attempts: 2, backoff_ms: 1}")
        with ThreadServer(create_app(config)) as gw:
            sdk = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", timeout=30)  # default retries
            assert sdk.max_retries == 2
            with pytest.raises(openai.APIStatusError) as caught:
                sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        hits = sl.stats()["requests"]
    assert hits == 2, "the gateway's two attempts, and no SDK retry on top"
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert "retry-after" not in caught.value.response.headers
