"""No caller can steer the canary (router/canary/weights.py): each caller weighs at most a
bounded share of a side, sides are compared over the callers they share, and what is the
caller's own doing (an answer cut by its max_tokens, an upstream 4xx for the request, leaving
early) is not the route's failure. Tables of inputs, then the whole app in-process."""

from __future__ import annotations

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.canary import bucket
from router.canary.analysis import Side, Verdict, analyse
from router.canary.weights import capped_weights, like_with_like, rates
from router.config import CanaryChecks
from router.record.callers import CallerCounts, callers_of
from tests.router.asgi import MockUpstreams, asgi_gateway, model_yaml


@pytest.mark.parametrize(
    ("sizes", "share", "expected"),
    [
        ({"a": 10, "b": 10, "c": 10}, 0.5, {"a": 10, "b": 10, "c": 10}),  # nobody over the cap
        ({"a": 900, "b": 50, "c": 50}, 0.5, {"a": 100, "b": 50, "c": 50}),  # a held to half
        ({"a": 900, "b": 100}, 0.5, {"a": 100, "b": 100}),  # two callers: even
        ({"a": 900, "b": 10, "c": 10, "d": 80}, 0.4, {"a": 40, "b": 10, "c": 10, "d": 40}),
        ({"a": 900}, 0.5, {"a": 1.0}),  # too few callers for the cap: every caller the same
        ({"a": 900, "b": 1}, 0.2, {"a": 1.0, "b": 1.0}),
        ({}, 0.5, {}),
    ],
)
def test_no_caller_weighs_more_than_its_share(sizes, share, expected):
    found = capped_weights(sizes, share)
    assert {c: round(v, 2) for c, v in found.items()} == expected
    total = sum(found.values())
    if total and len(sizes) * share >= 1:
        assert max(found.values()) <= share * total + 1e-9


def test_rates_give_each_caller_its_capped_weight():
    callers = {
        "loud": CallerCounts(requests=900, successes=0, errors=900),
        "a": CallerCounts(requests=50, successes=50),
        "b": CallerCounts(requests=50, successes=50),
    }
    found = rates(callers, 0.5)
    assert found.success_rate == pytest.approx(0.5) and found.error_rate == pytest.approx(0.5)
    assert found.callers == 3 and found.top_share == pytest.approx(0.9)


def test_sides_are_compared_over_the_callers_they_share():
    shared = CallerCounts(requests=100, successes=99)
    dedicated = {"honest": shared, "one-sided": CallerCounts(requests=500, successes=0)}
    serverless = {"honest": shared}
    ded, sl = like_with_like(dedicated, serverless, 0.5)
    assert ded.success_rate == sl.success_rate == pytest.approx(0.99)
    assert ded.callers == 1


def test_callers_are_read_from_the_routes_counters():
    found = callers_of(
        [{"by:key-a:n": 3, "by:key-a:ok": 2, "requests": 9}, {"by:key-a:n": 1, "by:key-b:n": 2}]
    )
    assert found == {"key-a": CallerCounts(4, 2, 0), "key-b": CallerCounts(2, 0, 0)}


def dedicated_users(model: str, percent: float, count: int) -> list[str]:
    """`user` values whose canary bucket lands on dedicated at `percent` (what an attacker picks)."""
    return [u for u in (f"user-{i}" for i in range(10 * count)) if bucket(model, u) < percent][:count]


def length_when_capped(request: httpx.Request) -> httpx.Response:
    capped = b'"max_tokens"' in request.content
    answer = {
        "id": "c",
        "object": "chat.completion",
        "model": "up",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x"},
                "finish_reason": "length" if capped else "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    content = orjson.dumps(answer)  # unread, as a transport gives it
    return httpx.Response(200, headers={"content-type": "application/json"}, stream=httpx.ByteStream(content))


@pytest.mark.parametrize("judged", ["success", "failure"])
async def test_a_key_that_cuts_its_own_answers_on_dedicated_cannot_roll_the_canary_back(judged):
    """However its cut answers are judged (success.length_under_max_tokens), they count on
    neither side: not in the rates, not in the latency per output token."""
    text = model_yaml(dedicated=("ded",), serverless=("sl1",), canary=50, capacity=64)
    text = text.replace("auth: {api_keys: [key]}", "auth: {api_keys: [key, attacker]}")
    text = text.replace(
        "    canary_percent: 50",
        # the rates are under test: in-process latencies are microseconds of scheduling noise
        "    canary_percent: 50\n    canary: {steps: [50, 100], min_samples: 10, checks: {e2e_per_token_p95_max_ratio: null}}\n"
        f"    success: {{length_under_max_tokens: {judged}}}",
    )

    async def reply(request: httpx.Request) -> httpx.Response:
        return length_when_capped(request)

    upstreams = MockUpstreams({"ded": reply, "sl1": reply})
    async with asgi_gateway(text, upstreams) as gw:
        for i in range(40):  # an honest key, its users spread over both sides
            await gw.chat(user=f"honest-{i}")
        for user in dedicated_users("m", 50, 60):  # the attacker: dedicated only, max_tokens 1
            await gw.client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [], "user": user, "max_tokens": 1},
                headers={"authorization": "Bearer attacker"},
            )
        config = gw.app.state.config.models["m"]
        analysis = await gw.app.state.canary.analyse("m", config)
    checks = {c.name: c for c in analysis.checks}
    assert analysis.dedicated.success_rate == pytest.approx(1.0)
    assert checks["success_rate_ratio"].result == "pass"
    assert analysis.verdict is not Verdict.FAIL
    assert "rests on few callers" in analysis.reason  # one honest key compared on each side


# --- no single caller moves the canary (issue 35) -----------------------------------------

CHECKS = CanaryChecks(ttft_p95_max_ratio=None, itl_p50_max_ratio=None)  # the rates alone


def _analysis(dedicated: dict[str, CallerCounts], serverless: dict[str, CallerCounts]):
    ded, sl = like_with_like(dedicated, serverless, 0.5, 3)

    def side(callers: dict[str, CallerCounts], weighted) -> Side:
        n = int(sum(c.requests for c in callers.values()))
        ok = int(sum(c.successes for c in callers.values()))
        errors = int(sum(c.errors for c in callers.values()))
        return Side(requests=n, successes=ok, errors=errors, weighted=weighted)

    return analyse(side(dedicated, ded), side(serverless, sl), CHECKS, min_samples=10, min_callers=3)


honest_callers = st.lists(
    st.tuples(st.integers(20, 300), st.integers(1, 4), st.sampled_from([1.0, 0.995, 0.99, 0.97])),
    min_size=3,
    max_size=8,
)


def _honest(callers: list[tuple[int, int, float]], dedicated_drop: float = 0.0):
    """Each honest caller succeeds at the same rate on both sides (less `dedicated_drop` on
    dedicated), with `ratio` times as many requests on serverless (its users' buckets)."""
    ded, sl = {}, {}
    for i, (n, ratio, rate) in enumerate(callers):
        ok = round(n * rate)
        ded[f"h{i}"] = CallerCounts(n, round(n * max(0.0, rate - dedicated_drop)) if dedicated_drop else ok)
        sl[f"h{i}"] = CallerCounts(n * ratio, ok * ratio)
    return ded, sl


@settings(max_examples=300, deadline=None)
@given(callers=honest_callers, share=st.floats(0.01, 0.25), errors=st.booleans())
def test_an_attacker_up_to_a_quarter_of_each_side_cannot_fail_a_healthy_run(callers, share, errors):
    """The issue's attack: one key picks `user` values that put requests failing the gateway's own
    checks (an unsatisfiable schema), or erroring, on dedicated and plain ones on serverless."""
    ded, sl = _honest(callers)
    n_ded = round(share / (1 - share) * sum(c.requests for c in ded.values()))
    n_sl = round(share / (1 - share) * sum(c.requests for c in sl.values()))
    ded["attacker"] = CallerCounts(max(1, n_ded), 0, max(1, n_ded) if errors else 0)
    sl["attacker"] = CallerCounts(max(1, n_sl), max(1, n_sl))
    found = _analysis(ded, sl)
    assert found.verdict is not Verdict.FAIL, found.reason
    assert "attacker" in found.dedicated.weighted.left_out


@settings(max_examples=300, deadline=None)
@given(callers=honest_callers, drop=st.floats(0.05, 0.5), attacked=st.booleans())
def test_a_dedicated_side_worse_for_everyone_still_fails(callers, drop, attacked):
    ded, sl = _honest(callers, dedicated_drop=drop)
    if attacked:  # a caller failing on serverless on purpose does not rescue a bad dedicated
        ded["attacker"] = CallerCounts(100, 100)
        sl["attacker"] = CallerCounts(100, 0, 100)
    found = _analysis(ded, sl)
    assert found.verdict is Verdict.FAIL
    assert "success_rate_ratio" in found.reason


def test_errors_on_dedicated_for_everyone_fail_the_error_ceiling():
    ded = {f"h{i}": CallerCounts(100, 95, 5) for i in range(4)}
    sl = {f"h{i}": CallerCounts(100, 100) for i in range(4)}
    found = _analysis(ded, sl)
    assert found.verdict is Verdict.FAIL and "error_rate_percent" in found.reason
