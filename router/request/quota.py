"""A named key's limits and budgets, before any upstream is called (docs/tenants.md).

Two steps, both before an upstream is called (router/state/quota.py states the rules):
- `count`, before the body is read (so a refused request costs no parse): a key at its `rpm`,
  whose `tpm` window has no room for the prompt, or whose `max_usd_per_day` /
  `max_usd_per_month` is spent (counting what its requests in flight reserved) is refused;
- `reserve`, once the body is peeked: a model outside the key's `models` is 403
  permission_denied; the request's worst case (prompt plus its token limit, or
  `limits.reserved_output_tokens`, times `n`) is reserved against the tpm window, and its
  worst-case cost (at the dearest of the model's serverless prices) against the budgets; a
  reservation that does not fit is 429 (tpm) or insufficient_quota.

Refusals: 429 rate_limit_exceeded with Retry-After until the window has room, `too_large` for
a request larger than the tpm, insufficient_quota with `x-should-retry: false` for a budget.
The figures go out as OpenAI's headers on every answer of a limited key:

    x-ratelimit-limit-requests, x-ratelimit-remaining-requests, x-ratelimit-reset-requests
    x-ratelimit-limit-tokens,   x-ratelimit-remaining-tokens,   x-ratelimit-reset-tokens

The store counts across replicas; a store that cannot be reached refuses the limited key's
request (503): a limit that cannot be counted is not enforced by guessing. `settle` replaces
the reservation with the tokens the answer used and what it cost.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from router.config import KeyConfig, ModelConfig
from router.economics.cost import token_cost_usd
from router.errors import InsufficientQuota, PermissionDenied, RateLimited, StoreUnavailable
from router.openai import BYTES_PER_TOKEN, RequestPeek
from router.state.quota import QuotaAnswer, QuotaAsk, Step

log = logging.getLogger("tidegate")


class QuotaStore(Protocol):
    async def take_quota(self, ask: QuotaAsk) -> QuotaAnswer: ...

    async def settle_quota(self, ask: QuotaAsk, tokens: int, usd: float) -> None: ...


@dataclass(frozen=True, slots=True)
class Worst:
    """A request's worst case, for its key's reservation: its model, its tokens (prompt plus
    output bound, times `n`), their cost at the dearest serverless price, and how long the
    reservation may stand (the request's deadline, with room)."""

    model: str
    tokens: int
    usd: float
    hold_ms: int


def worst_case(request: RequestPeek, config: ModelConfig, default_output: int, timeout_s: float) -> Worst:
    output = (request.output_limit or default_output) * request.sequences
    prices = [(e.usd_per_mtok_in, e.usd_per_mtok_out) for e in config.serverless]
    usd = max(
        (token_cost_usd(request.prompt_tokens, output, p_in, p_out) for p_in, p_out in prices), default=0.0
    )
    return Worst(request.model, request.prompt_tokens + output, usd, int(timeout_s * 2000))


@dataclass(frozen=True, slots=True)
class Grant:
    """What an admitted request took from its key's quota, and the headers that say so."""

    ask: QuotaAsk
    headers: dict[str, str]


class Quota:
    def __init__(self, store: QuotaStore, registry: CollectorRegistry | None = None) -> None:
        self._store = store
        self._settling: set[asyncio.Task[None]] = set()
        self._labelled: dict[str, set[tuple[str, tuple[str, ...]]]] = {}  # key -> its series
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
        self.budget_used = Gauge(
            "tidegate_key_budget_used_ratio",
            "A named key's spend over its budget (all replicas), as of its last request, by period",
            ("key", "team", "period"),
            registry=registry,
        )

    async def admit(self, key: KeyConfig | None, body_bytes: int, request_id: str) -> Grant | None:
        """The `count` step, before the body is read: the key's grant (None: a key without
        limits or budgets); a ClientError refuses."""
        if key is None or not _limited(key):
            return None
        now = datetime.now(UTC)
        ask = QuotaAsk(
            key.name,
            request_id,
            max(1, body_bytes // BYTES_PER_TOKEN),
            key.rpm,
            key.tpm,
            now.strftime("%Y-%m-%d"),
            now.strftime("%Y-%m"),
            key.max_usd_per_day,
            key.max_usd_per_month,
        )
        answer = await self._take(key, ask)
        return Grant(ask, ratelimit_headers(key, answer))

    async def reserve(self, key: KeyConfig | None, grant: Grant | None, worst: Worst) -> Grant | None:
        """The `reserve` step, once the body is peeked: the model is the key's to use, and the
        request's worst case fits its tpm and budgets. The grant to settle (the count step's
        when nothing is reserved)."""
        if key is None:
            return grant
        if key.models is not None and worst.model not in key.models:
            raise PermissionDenied(
                f"The key {key.name} may not use the model `{worst.model}`.", param="model"
            )
        if grant is None or (
            key.tpm is None and key.max_usd_per_day is None and key.max_usd_per_month is None
        ):
            return grant
        ask = replace(grant.ask, step=Step.RESERVE, tokens=worst.tokens, usd=worst.usd, hold_ms=worst.hold_ms)
        answer = await self._take(key, ask)
        return Grant(ask, ratelimit_headers(key, answer))

    async def _take(self, key: KeyConfig, ask: QuotaAsk) -> QuotaAnswer:
        try:
            answer = await self._store.take_quota(ask)
        except StoreUnavailable as exc:  # a limit that cannot be counted is not guessed
            raise StoreUnavailable(
                f"The limits of key {key.name} cannot be checked now; retry shortly.",
                detail=exc.detail,
                headers={"retry-after": "1"},
            ) from exc
        self._budgets(key, answer)
        if answer.refused is not None:
            self._labelled.setdefault(key.name, set()).add(("refusals", (key.name, answer.refused)))
            self.refusals.labels(key.name, answer.refused).inc()
            raise _refusal(key, ask, answer, ratelimit_headers(key, answer))
        return answer

    def _budgets(self, key: KeyConfig, answer: QuotaAnswer) -> None:
        """The share of each budget the key has spent (the alert rules' "nearly spent")."""
        for period, cap, spent in (
            ("day", key.max_usd_per_day, answer.spent_day),
            ("month", key.max_usd_per_month, answer.spent_month),
        ):
            if cap:
                labels = (key.name, key.team, period)
                self._labelled.setdefault(key.name, set()).add(("budget_used", labels))
                self.budget_used.labels(*labels).set(spent / cap)

    def count(self, key: KeyConfig, *, ok: bool, usd: float) -> None:
        """A named key's request in Prometheus (labels only for keys that exist: bounded)."""
        self._labelled.setdefault(key.name, set()).add(
            ("requests", (key.name, key.team, "ok" if ok else "failed"))
        )
        self.requests.labels(key.name, key.team, "ok" if ok else "failed").inc()
        if usd:
            self._labelled[key.name].add(("spend", (key.name, key.team)))
            self.spend.labels(key.name, key.team).inc(usd)

    def forget(self, name: str) -> None:
        """A revoked key's series leave /metrics (the key is gone; its series would stay forever)."""
        for metric, labels in self._labelled.pop(name, set()):
            getattr(self, metric).remove(*labels)

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
        held = (
            f" (${answer.reserved_usd:.4f} more reserved by its requests in flight)"
            if answer.reserved_usd
            else ""
        )
        return InsufficientQuota(
            f"The key {key.name} has spent ${spent:.4f} of its ${cap:g} budget for this {period} (UTC){held}"
            + (f"; this request could cost up to ${ask.usd:.4f}." if ask.step is Step.RESERVE else "."),
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
