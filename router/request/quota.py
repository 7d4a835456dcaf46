"""A named key's limits and budgets, before any upstream is called (docs/tenants.md).

`admit` refuses a model outside the key's `models` (403 permission_denied), a key at its
`rpm` or `tpm` (429 rate_limit_exceeded, Retry-After until the window has room), a request
larger than its `tpm` (429), and a key whose `max_usd_per_day` or `max_usd_per_month` is
spent (429 insufficient_quota, `x-should-retry: false`). The figures go out as OpenAI's
headers on every answer of a limited key:

    x-ratelimit-limit-requests, x-ratelimit-remaining-requests, x-ratelimit-reset-requests
    x-ratelimit-limit-tokens,   x-ratelimit-remaining-tokens,   x-ratelimit-reset-tokens

The store counts across replicas (router/state/quota.py); a store that cannot be reached
refuses the limited key's request (503): a limit that cannot be counted is not enforced by
guessing. `settle` replaces the prompt estimate with the tokens the answer used and adds its
cost to the key's day and month.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter

from router.config import KeyConfig
from router.errors import InsufficientQuota, PermissionDenied, RateLimited, StoreUnavailable
from router.openai import RequestPeek
from router.state.quota import QuotaAnswer, QuotaAsk

log = logging.getLogger("tidegate")


class QuotaStore(Protocol):
    async def take_quota(self, ask: QuotaAsk) -> QuotaAnswer: ...

    async def settle_quota(self, ask: QuotaAsk, tokens: int, usd: float) -> None: ...


@dataclass(frozen=True, slots=True)
class Grant:
    """What an admitted request took from its key's quota, and the headers that say so."""

    ask: QuotaAsk
    headers: dict[str, str]


class Quota:
    def __init__(self, store: QuotaStore, registry: CollectorRegistry | None = None) -> None:
        self._store = store
        self._settling: set[asyncio.Task[None]] = set()
        self.requests = Counter(
            "tidegate_key_requests",
            "Requests of named keys, by key, team and result (ok, failed)",
            ("key", "team", "result"),
            registry=registry,
        )
        self.spend = Counter(
            "tidegate_key_spend_usd",
            "Token-priced spend of named keys (serverless answers at their prices)",
            ("key", "team"),
            registry=registry,
        )
        self.refusals = Counter(
            "tidegate_key_refusals",
            "Requests a named key's limits refused, by key and reason",
            ("key", "reason"),
            registry=registry,
        )

    async def admit(self, key: KeyConfig | None, request: RequestPeek, request_id: str) -> Grant | None:
        """The key's grant (None: a key without limits or budgets); a ClientError refuses."""
        if key is None:
            return None
        if key.models is not None and request.model not in key.models:
            raise PermissionDenied(
                f"The key {key.name} may not use the model `{request.model}`.", param="model"
            )
        if not _limited(key):
            return None
        now = datetime.now(UTC)
        ask = QuotaAsk(
            key.name,
            request_id,
            request.prompt_tokens,
            key.rpm,
            key.tpm,
            now.strftime("%Y-%m-%d"),
            now.strftime("%Y-%m"),
            key.max_usd_per_day,
            key.max_usd_per_month,
        )
        try:
            answer = await self._store.take_quota(ask)
        except StoreUnavailable as exc:  # a limit that cannot be counted is not guessed
            raise StoreUnavailable(
                f"The limits of key {key.name} cannot be checked now; retry shortly.",
                detail=exc.detail,
                headers={"retry-after": "1"},
            ) from exc
        headers = ratelimit_headers(key, answer)
        if answer.refused is not None:
            self.refusals.labels(key.name, answer.refused).inc()
            raise _refusal(key, ask, answer, headers)
        return Grant(ask, headers)

    def count(self, key: KeyConfig, *, ok: bool, usd: float) -> None:
        """A named key's request in Prometheus (labels only for keys that exist: bounded)."""
        self.requests.labels(key.name, key.team, "ok" if ok else "failed").inc()
        if usd:
            self.spend.labels(key.name, key.team).inc(usd)

    def settle_later(self, grant: Grant, tokens: int, usd: float) -> None:
        """After the answer: its tokens replace the estimate; its cost joins the budgets."""
        task = asyncio.get_running_loop().create_task(self._settle(grant, tokens, usd))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(self, grant: Grant, tokens: int, usd: float) -> None:
        try:
            await self._store.settle_quota(grant.ask, tokens, usd)
        except StoreUnavailable as exc:  # the estimate stays counted; the spend is lost, loudly
            log.warning("key %s: usage not settled: %s", grant.ask.key, exc)


def _limited(key: KeyConfig) -> bool:
    limits = (key.rpm, key.tpm, key.max_usd_per_day, key.max_usd_per_month)
    return any(x is not None for x in limits)


def ratelimit_headers(key: KeyConfig, answer: QuotaAnswer) -> dict[str, str]:
    headers = {}
    if key.rpm is not None:
        headers["x-ratelimit-limit-requests"] = str(key.rpm)
        headers["x-ratelimit-remaining-requests"] = str(max(0, key.rpm - answer.requests))
        headers["x-ratelimit-reset-requests"] = duration(answer.requests_reset_s)
    if key.tpm is not None:
        headers["x-ratelimit-limit-tokens"] = str(key.tpm)
        headers["x-ratelimit-remaining-tokens"] = str(max(0, key.tpm - answer.tokens))
        headers["x-ratelimit-reset-tokens"] = duration(answer.tokens_reset_s)
    return headers


def duration(seconds: float) -> str:
    """OpenAI's reset format: `1s`, `6m0s`, `120ms`."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


def _refusal(
    key: KeyConfig, ask: QuotaAsk, answer: QuotaAnswer, headers: dict[str, str]
) -> RateLimited | InsufficientQuota:
    if answer.refused in ("day_budget", "month_budget"):
        period, cap, spent = (
            ("day", key.max_usd_per_day, answer.spent_day)
            if answer.refused == "day_budget"
            else ("month", key.max_usd_per_month, answer.spent_month)
        )
        return InsufficientQuota(
            f"The key {key.name} has spent ${spent:.4f} of its ${cap:g} budget for this {period} (UTC).",
            headers=headers | {"x-should-retry": "false"},
        )
    if answer.refused == "requests":
        return RateLimited(
            f"Rate limit reached for key {key.name} on requests per min (RPM): "
            f"Limit {key.rpm}, Used {answer.requests}, Requested 1.",
            retry_after_s=max(1, math.ceil(answer.requests_reset_s)),
            headers=headers,
        )
    if answer.refused == "too_large":
        return RateLimited(
            f"Request too large for key {key.name} on tokens per min (TPM): "
            f"Limit {key.tpm}, Requested {ask.tokens}.",
            retry_after_s=60,
            headers=headers | {"x-should-retry": "false"},
        )
    return RateLimited(
        f"Rate limit reached for key {key.name} on tokens per min (TPM): "
        f"Limit {key.tpm}, Used {answer.tokens}, Requested {ask.tokens}.",
        retry_after_s=max(1, math.ceil(answer.tokens_reset_s)),
        headers=headers,
    )
