"""Per-key rate limits, budgets and the keys made through the admin API, in Redis
(router/state/quota.py states the rules; the memory store keeps the same ones). Every key of
one client key shares a hash tag, so a take is one script on one Cluster node."""

from __future__ import annotations

from typing import Any

from router.errors import StoreUnavailable
from router.state.quota import WINDOW_S, QuotaAnswer, QuotaAsk
from router.state.redis.link import RedisRole
from router.state.redis.readings import as_mapping
from router.state.redis.scripts import NOW_MS, Script

# KEYS: requests log (zset member -> ms), tokens log (zset member -> ms), tokens by member
# (hash), tokens sum, day spend, month spend, reservations (zset member -> until ms),
# reserved usd by member (hash). ARGV: member, tokens, rpm, tpm, day cap, month cap (-1: none),
# window ms, step ('count' or 'reserve'), usd, hold ms. The rules are router/state/quota.py's
# `refusal`. Returns {refused ('' when admitted), requests, tokens, requests reset ms, tokens
# reset ms, day spend, month spend, reserved usd}.
_TAKE_LUA = (
    NOW_MS
    + """
local window = tonumber(ARGV[7])
local cutoff = now_ms - window
local rpm, tpm = tonumber(ARGV[3]), tonumber(ARGV[4])
local day_cap, month_cap = tonumber(ARGV[5]), tonumber(ARGV[6])
local n = tonumber(ARGV[2])
local step, usd, hold = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', cutoff)
if #old > 0 then
  local gone = 0
  for _, m in ipairs(old) do
    gone = gone + tonumber(redis.call('HGET', KEYS[3], m) or '0')
    redis.call('HDEL', KEYS[3], m)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', cutoff)
  redis.call('DECRBY', KEYS[4], gone)
end
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now_ms)
for _, m in ipairs(lapsed) do redis.call('HDEL', KEYS[8], m) end
redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now_ms)
local reserved = 0
for _, v in ipairs(redis.call('HVALS', KEYS[8])) do reserved = reserved + tonumber(v) end
local requests = redis.call('ZCARD', KEYS[1])
local tokens = tonumber(redis.call('GET', KEYS[4]) or '0')
local day = tonumber(redis.call('GET', KEYS[5]) or '0')
local month = tonumber(redis.call('GET', KEYS[6]) or '0')
local refused = ''
local function over(spent, cap)
  if cap < 0 then return false end
  if step == 'count' then return spent + reserved >= cap end
  return spent + reserved + usd > cap and not (reserved <= 0 and spent < cap)
end
if over(day, day_cap) then refused = 'day_budget'
elseif over(month, month_cap) then refused = 'month_budget'
elseif step == 'count' and rpm >= 0 and requests >= rpm then refused = 'requests'
elseif tpm >= 0 and n > tpm then refused = 'too_large'
elseif tpm >= 0 and tokens + n > tpm then refused = 'tokens'
end
if refused == '' and step == 'count' and rpm >= 0 then
  redis.call('ZADD', KEYS[1], now_ms, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], 2 * window)
  requests = requests + 1
end
if refused == '' and step == 'reserve' then
  if tpm >= 0 then
    redis.call('ZADD', KEYS[2], now_ms, ARGV[1])
    redis.call('HSET', KEYS[3], ARGV[1], n)
    redis.call('INCRBY', KEYS[4], n)
    for i = 2, 4 do redis.call('PEXPIRE', KEYS[i], 2 * window) end
    tokens = tokens + n
  end
  if usd > 0 then
    redis.call('ZADD', KEYS[7], now_ms + hold, ARGV[1])
    redis.call('HSET', KEYS[8], ARGV[1], ARGV[9])
    redis.call('PEXPIRE', KEYS[7], 2 * hold)
    redis.call('PEXPIRE', KEYS[8], 2 * hold)
  end
end
local function reset(key)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if #first == 0 then return 0 end
  return math.max(0, tonumber(first[2]) + window - now_ms)
end
return {refused, requests, tokens, reset(KEYS[1]), reset(KEYS[2]), tostring(day), tostring(month),
  tostring(reserved)}
"""
)

# KEYS: tokens by member (hash), tokens sum, day spend, month spend, reservations (zset),
# reserved usd by member (hash). ARGV: member, tokens, usd, day ttl ms, month ttl ms. The
# estimate becomes the answer's tokens, the reservation goes, the spend is added.
_SETTLE_LUA = """
local before = redis.call('HGET', KEYS[1], ARGV[1])
if before then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  redis.call('INCRBY', KEYS[2], tonumber(ARGV[2]) - tonumber(before))
end
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
if tonumber(ARGV[3]) > 0 then
  redis.call('INCRBYFLOAT', KEYS[3], ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
  redis.call('INCRBYFLOAT', KEYS[4], ARGV[3])
  redis.call('PEXPIRE', KEYS[4], ARGV[5])
end
return 1
"""

# KEYS: the made keys (hash). ARGV: name, entry, '1' (the name must be new) or '0' (its entry
# must still be ARGV[4]). Stores the entry and returns 1, or changes nothing and returns 0.
_PUT_KEY_LUA = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if (ARGV[3] == '1' and current ~= false) or (ARGV[3] == '0' and current ~= ARGV[4]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

TAKE = Script(_TAKE_LUA)
PUT_KEY = Script(_PUT_KEY_LUA)
SETTLE = Script(_SETTLE_LUA)
_DAY_MS = 2 * 86400 * 1000  # a day's ledger outlives its day (reports read yesterday's)
_MONTH_MS = 62 * 86400 * 1000


class RedisQuotas(RedisRole):
    REQUEST_PATH = True  # a request's take and settle

    def _quota_keys(self, key: str) -> list[str]:
        base = f"{self._keys.prefix}:q:{{{key}}}"
        return [f"{base}:req", f"{base}:tokt", f"{base}:tokn", f"{base}:toks"]

    def _spend_keys(self, key: str, day: str, month: str) -> list[str]:
        base = f"{self._keys.prefix}:q:{{{key}}}"
        return [f"{base}:usd:{day}", f"{base}:usd:{month}"]

    def _reservation_keys(self, key: str) -> list[str]:
        base = f"{self._keys.prefix}:q:{{{key}}}"
        return [f"{base}:resz", f"{base}:resu"]

    async def take_quota(self, ask: QuotaAsk) -> QuotaAnswer:
        keys = [
            *self._quota_keys(ask.key),
            *self._spend_keys(ask.key, ask.day, ask.month),
            *self._reservation_keys(ask.key),
        ]
        args = [
            ask.member,
            ask.tokens,
            _or_none(ask.rpm),
            _or_none(ask.tpm),
            _or_none(ask.max_usd_per_day),
            _or_none(ask.max_usd_per_month),
            int(WINDOW_S * 1000),
            ask.step.value,
            repr(ask.usd),
            ask.hold_ms,
        ]
        found = await self._run(f"the limits of {ask.key} could not be checked", TAKE, keys, args)
        try:
            return QuotaAnswer(
                _text(found[0]) or None,
                int(found[1]),
                int(found[2]),
                int(found[3]) / 1000,
                int(found[4]) / 1000,
                float(_text(found[5])),
                float(_text(found[6])),
                float(_text(found[7])),
            )
        except (TypeError, ValueError, IndexError) as exc:  # not what the script returns
            raise StoreUnavailable(f"the limits of {ask.key}: an unreadable answer ({exc})") from exc

    async def settle_quota(self, ask: QuotaAsk, tokens: int, usd: float) -> None:
        keys = [
            *self._quota_keys(ask.key)[2:],
            *self._spend_keys(ask.key, ask.day, ask.month),
            *self._reservation_keys(ask.key),
        ]
        args = [ask.member, tokens, repr(usd), _DAY_MS, _MONTH_MS]
        await self._run(f"the usage of {ask.key} could not be settled", SETTLE, keys, args)

    async def spent(self, key: str, day: str, month: str) -> tuple[float, float]:
        # one slot (the key's hash tag): one MGET, on Cluster too
        day_usd, month_usd = await self._ask(
            f"the spend of {key} could not be read", "MGET", *self._spend_keys(key, day, month)
        )
        return float(_text(day_usd) or 0), float(_text(month_usd) or 0)

    async def put_key(self, name: str, entry: bytes, *, replacing: bytes | None = None) -> bool:
        args = [name, entry, "1" if replacing is None else "0", replacing or b""]
        swapped = await self._run("the key could not be stored", PUT_KEY, [self._keys.made_keys], args)
        return bool(swapped)

    async def made_keys(self) -> dict[str, bytes]:
        found = await self._ask("the keys could not be read", "HGETALL", self._keys.made_keys)
        return {k.decode(): v for k, v in as_mapping(found).items()}


def _or_none(value: float | None) -> Any:
    return -1 if value is None else repr(value) if isinstance(value, float) else value


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)
