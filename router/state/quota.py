"""Per-key rate limits and budgets as the stores keep them (router/request/quota.py decides
with them; docs/tenants.md).

Limits are sliding windows of 60 s, exact across replicas: a log of the key's admitted
requests (and of their tokens, with a running sum) in the window. Budgets are ledgers of the
key's spend per UTC day and month, beside the reservations of its requests in flight.

A request takes its quota in two steps, each one atomic step (one Lua script in Redis):
- `count`, before its body is read: the request joins the rpm window unless the key is at its
  rpm, its tpm window has no room for the prompt, or a budget is spent (with what is reserved);
- `reserve`, once its body is read: its worst case (prompt plus output bound, times `n`) joins
  the tpm window, and its worst-case cost is reserved against the day and month budgets. A
  reservation that does not fit is refused, unless the key has nothing else reserved and its
  budget is not spent (a lone request may take what is left: a budget is overshot by at most
  one request's worst case). A reservation lapses after its `hold_ms` (a replica that died).
`settle` replaces the reservation with what the answer used and cost.

The memory store implements the same rules for one process."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

WINDOW_S = 60.0


class Step(StrEnum):
    COUNT = "count"  # before the body: the rpm window, and refusals on what is already used
    RESERVE = "reserve"  # after: the worst case against the tpm window and the budgets


@dataclass(frozen=True, slots=True)
class QuotaAsk:
    key: str  # the key's name
    member: str  # this request's id
    tokens: int  # count: the prompt estimate (bytes / 4); reserve: the worst case
    rpm: int | None = None
    tpm: int | None = None
    day: str = ""  # the UTC day and month the budgets count in ("2026-12-02", "2026-12")
    month: str = ""
    max_usd_per_day: float | None = None
    max_usd_per_month: float | None = None
    step: Step = Step.COUNT
    usd: float = 0.0  # reserve: the worst-case cost
    hold_ms: int = 1_200_000  # how long a reservation stands without its settle


@dataclass(frozen=True, slots=True)
class QuotaAnswer:
    """`refused`: None (admitted), `requests`, `tokens`, `too_large` (more tokens than the
    tpm), `day_budget` or `month_budget`. Used and reset figures are after the take."""

    refused: str | None
    requests: int  # in the window
    tokens: int
    requests_reset_s: float  # until the oldest request leaves the window
    tokens_reset_s: float
    spent_day: float = 0.0
    spent_month: float = 0.0
    reserved_usd: float = 0.0  # by the key's other requests in flight


@dataclass(slots=True)
class _Window:
    requests: deque[tuple[float, str]] = field(default_factory=deque)
    tokens: dict[str, tuple[float, int]] = field(default_factory=dict)  # member -> (at, tokens)
    token_sum: int = 0

    def expire(self, now: float) -> None:
        while self.requests and self.requests[0][0] <= now - WINDOW_S:
            self.requests.popleft()
        for member, (at, n) in list(self.tokens.items()):
            if at <= now - WINDOW_S:
                del self.tokens[member]
                self.token_sum -= n

    def resets(self, now: float) -> tuple[float, float]:
        first_request = self.requests[0][0] if self.requests else now - WINDOW_S
        first_token = min((at for at, _ in self.tokens.values()), default=now - WINDOW_S)
        return max(0.0, first_request + WINDOW_S - now), max(0.0, first_token + WINDOW_S - now)


class MemoryQuotas:
    def __init__(self) -> None:
        self._windows: dict[str, _Window] = {}
        self._key_spend: dict[str, float] = {}  # "key|day" and "key|month" -> usd
        self._reserved: dict[str, dict[str, tuple[float, float]]] = {}  # key -> member -> (until, usd)
        self._keys: dict[str, bytes] = {}  # name -> a key made through the admin API (JSON)

    async def take_quota(self, ask: QuotaAsk) -> QuotaAnswer:
        now = time.time()
        window = self._windows.setdefault(ask.key, _Window())
        window.expire(now)
        reservations = self._reserved.setdefault(ask.key, {})
        for member in [m for m, (until, _) in reservations.items() if until <= now]:
            del reservations[member]
        reserved = sum(usd for _, usd in reservations.values())
        day, month = (
            self._key_spend.get(f"{ask.key}|{ask.day}", 0.0),
            self._key_spend.get(f"{ask.key}|{ask.month}", 0.0),
        )
        refused = refusal(ask, Used(len(window.requests), window.token_sum, day, month, reserved))
        if refused is None and ask.step is Step.COUNT and ask.rpm is not None:
            window.requests.append((now, ask.member))
        if refused is None and ask.step is Step.RESERVE:
            if ask.tpm is not None:
                window.tokens[ask.member] = (now, ask.tokens)
                window.token_sum += ask.tokens
            if ask.usd > 0:
                reservations[ask.member] = (now + ask.hold_ms / 1000, ask.usd)
        reset_requests, reset_tokens = window.resets(now)
        return QuotaAnswer(
            refused,
            len(window.requests),
            window.token_sum,
            reset_requests,
            reset_tokens,
            day,
            month,
            reserved,
        )

    async def settle_quota(self, ask: QuotaAsk, tokens: int, usd: float) -> None:
        window = self._windows.get(ask.key)
        if window is not None and ask.member in window.tokens:
            at, before = window.tokens[ask.member]
            window.tokens[ask.member] = (at, tokens)
            window.token_sum += tokens - before
        self._reserved.get(ask.key, {}).pop(ask.member, None)
        if usd > 0:
            for period in (ask.day, ask.month):
                name = f"{ask.key}|{period}"
                self._key_spend[name] = self._key_spend.get(name, 0.0) + usd

    async def spent(self, key: str, day: str, month: str) -> tuple[float, float]:
        return self._key_spend.get(f"{key}|{day}", 0.0), self._key_spend.get(f"{key}|{month}", 0.0)

    async def put_key(self, name: str, entry: bytes, *, replacing: bytes | None = None) -> bool:
        if self._keys.get(name) != replacing:
            return False
        self._keys[name] = entry
        return True

    async def made_keys(self) -> dict[str, bytes]:
        return dict(self._keys)


@dataclass(frozen=True, slots=True)
class Used:
    """What a key has used when a step is asked: requests and tokens in the window, the day's
    and month's spend, and what its requests in flight reserved."""

    requests: int
    tokens: int
    day: float
    month: float
    reserved: float


def refusal(ask: QuotaAsk, used: Used) -> str | None:
    """Why the step is refused (the same rules, in the same order, as the Redis script), or None."""
    budgets = (
        ("day_budget", used.day, ask.max_usd_per_day),
        ("month_budget", used.month, ask.max_usd_per_month),
    )
    for name, spent, cap in budgets:
        if cap is not None and _over(ask, spent, cap, used.reserved):
            return name
    if ask.step is Step.COUNT and ask.rpm is not None and used.requests >= ask.rpm:
        return "requests"
    if ask.tpm is not None and ask.tokens > ask.tpm:
        return "too_large"
    if ask.tpm is not None and used.tokens + ask.tokens > ask.tpm:
        return "tokens"
    return None


def _over(ask: QuotaAsk, spent: float, cap: float, reserved: float) -> bool:
    """A budget refuses the count when it is spent (what is reserved included), and a
    reservation that does not fit, unless nothing else is reserved and it is not spent."""
    if ask.step is Step.COUNT:
        return spent + reserved >= cap
    return spent + reserved + ask.usd > cap and not (reserved <= 0 and spent < cap)
