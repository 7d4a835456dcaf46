"""Per-key rate limits and budgets as the stores keep them (router/request/quota.py decides
with them; docs/tenants.md).

Limits are sliding windows of 60 s, exact across replicas: a log of the key's admitted
requests (and of their tokens, with a running sum) in the window; a request is admitted while
the window holds fewer than `rpm` requests and its estimated tokens fit under `tpm`. Budgets
are ledgers of the key's spend per UTC day and month; a key at or over a cap is refused. The
take is one atomic step per request (one Lua script in Redis); the settle replaces the
estimate with the tokens the answer used and adds what it cost.

The memory store implements the same rules for one process."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class QuotaAsk:
    key: str  # the key's name
    member: str  # this request's id
    tokens: int  # estimated: the prompt (bytes / 4)
    rpm: int | None = None
    tpm: int | None = None
    day: str = ""  # the UTC day and month the budgets count in ("2026-12-02", "2026-12")
    month: str = ""
    max_usd_per_day: float | None = None
    max_usd_per_month: float | None = None


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
        self._keys: dict[str, bytes] = {}  # name -> a key made through the admin API (JSON)

    async def take_quota(self, ask: QuotaAsk) -> QuotaAnswer:
        now = time.time()
        window = self._windows.setdefault(ask.key, _Window())
        window.expire(now)
        day, month = (
            self._key_spend.get(f"{ask.key}|{ask.day}", 0.0),
            self._key_spend.get(f"{ask.key}|{ask.month}", 0.0),
        )
        refused = _refusal(ask, len(window.requests), window.token_sum, day, month)
        if refused is None:
            window.requests.append((now, ask.member))
            window.tokens[ask.member] = (now, ask.tokens)
            window.token_sum += ask.tokens
        reset_requests, reset_tokens = window.resets(now)
        return QuotaAnswer(
            refused, len(window.requests), window.token_sum, reset_requests, reset_tokens, day, month
        )

    async def settle_quota(self, ask: QuotaAsk, tokens: int, usd: float) -> None:
        window = self._windows.get(ask.key)
        if window is not None and ask.member in window.tokens:
            at, before = window.tokens[ask.member]
            window.tokens[ask.member] = (at, tokens)
            window.token_sum += tokens - before
        for period in (ask.day, ask.month):
            name = f"{ask.key}|{period}"
            self._key_spend[name] = self._key_spend.get(name, 0.0) + usd

    async def spent(self, key: str, day: str, month: str) -> tuple[float, float]:
        return self._key_spend.get(f"{key}|{day}", 0.0), self._key_spend.get(f"{key}|{month}", 0.0)

    async def put_key(self, name: str, entry: bytes) -> None:
        self._keys[name] = entry

    async def made_keys(self) -> dict[str, bytes]:
        return dict(self._keys)


def _refusal(ask: QuotaAsk, requests: int, tokens: int, day: float, month: float) -> str | None:
    """Why the take is refused (the same order in the Redis script), or None."""
    if ask.max_usd_per_day is not None and day >= ask.max_usd_per_day:
        return "day_budget"
    if ask.max_usd_per_month is not None and month >= ask.max_usd_per_month:
        return "month_budget"
    if ask.rpm is not None and requests >= ask.rpm:
        return "requests"
    if ask.tpm is not None and ask.tokens > ask.tpm:
        return "too_large"
    if ask.tpm is not None and tokens + ask.tokens > ask.tpm:
        return "tokens"
    return None
