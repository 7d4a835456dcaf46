"""A batch request and the canary (docs/tenants.md): outside the canary it still goes to
dedicated by default (batch never pays serverless prices for being outside it), and follows
the gate only when the model says `routing.batch.canary: follow`."""

from __future__ import annotations

import pytest

from policies.canary import bucket
from tests.router.asgi import MockUpstreams, answers, asgi_gateway, chat_reply, model_yaml

_CANDIDATES = [f"user-{i}" for i in range(1000)]
INSIDE = {u for u in _CANDIDATES if bucket("m", u) < 10}  # the canary's 10%
USERS = sorted(INSIDE)[:6] + [u for u in _CANDIDATES if u not in INSIDE][:24]


def batch_config(canary: str | None) -> str:
    text = model_yaml(dedicated=("ded",), serverless=("sl1",), canary=10, capacity=64)
    setting = f", canary: {canary}" if canary else ""
    return text.replace(
        "    canary_percent: 10", f"    canary_percent: 10\n    routing: {{batch: {{max_wait_s: 5{setting}}}}}"
    )


async def routes_of(text: str, priority: str) -> list[tuple[str, str]]:
    upstreams = MockUpstreams({"ded": answers(chat_reply()), "sl1": answers(chat_reply())})
    seen = []
    async with asgi_gateway(text, upstreams) as gw:
        for user in USERS:
            reply = await gw.client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": user},
                headers={"x-tidegate-priority": priority},
            )
            assert reply.status_code == 200, reply.text
            seen.append((reply.headers["x-tidegate-route"], reply.headers["x-tidegate-reason"]))
    return seen


@pytest.mark.parametrize("setting", [None, "dedicated"])
async def test_a_batch_request_outside_the_canary_still_goes_to_dedicated(setting):
    seen = await routes_of(batch_config(setting), "batch")
    assert {route for route, _ in seen} == {"ded"}
    assert "canary_out" not in {reason for _, reason in seen}


async def test_a_batch_request_follows_the_canary_when_the_model_says_so():
    seen = await routes_of(batch_config("follow"), "batch")
    assert_follows_the_canary(seen)


async def test_interactive_requests_still_follow_the_canary():
    assert_follows_the_canary(await routes_of(batch_config(None), "interactive"))


def assert_follows_the_canary(seen: list[tuple[str, str]]) -> None:
    for user, (route, reason) in zip(USERS, seen, strict=True):
        assert (route == "ded") is (user in INSIDE), user
        assert (reason == "canary_out") is (user not in INSIDE), user
