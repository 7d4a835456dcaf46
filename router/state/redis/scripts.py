"""The Redis store's Lua scripts. Each runs atomically on the server and reads the time
from Redis (`TIME`), so every replica agrees on lease expiry whatever its own clock says.
Key layout: router/state/redis/keys.py; the protocol around them: the role modules of
router/state/redis/.
"""

from __future__ import annotations

import hashlib


class Script(str):
    """A Lua script's source, with the SHA1 Redis knows it by (EVALSHA)."""

    __slots__ = ()

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.encode()).hexdigest()


NOW_MS = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
"""

# KEYS: slots, queue, seen, pending (hash: token -> prompt tokens), pending sum, the token's
# tombstone. ARGV: capacity, token, ttl_ms, wait (1: join or stay in line), stale_ms, weight
# (slots this request takes: members TOKEN, TOKEN#2 ...), max_waiters, prompt tokens, max
# pending tokens (-1: no limit). Returns 1 + the pool's pending prompt tokens when admitted, 0
# when not (in line if asked), -1 when the line is full. Expired leases take their pending
# tokens with them. A token REMOVE has marked gone is never admitted nor queued: its caller
# gave up, and the removal may have reached Redis before this acquire did.
_ACQUIRE_LUA = (
    NOW_MS
    + """
if redis.call('EXISTS', KEYS[6]) == 1 then
  return 0
end
if redis.call('HLEN', KEYS[4]) > 0 then
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms)
  for i = 1, #expired do
    local t = redis.call('HGET', KEYS[4], expired[i])
    if t then
      redis.call('HDEL', KEYS[4], expired[i])
      redis.call('DECRBY', KEYS[5], t)
    end
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_ms - tonumber(ARGV[5]))
for i = 1, #stale do
  redis.call('ZREM', KEYS[2], stale[i])
  redis.call('ZREM', KEYS[3], stale[i])
end
local free = tonumber(ARGV[1]) - redis.call('ZCARD', KEYS[1])
local weight = tonumber(ARGV[6])
local rank = redis.call('ZRANK', KEYS[2], ARGV[2])
local ahead = rank or redis.call('ZCARD', KEYS[2])
local tokens = tonumber(ARGV[8])
local limit = tonumber(ARGV[9])
local pending = 0
if tokens > 0 or limit >= 0 then
  pending = math.max(0, tonumber(redis.call('GET', KEYS[5]) or '0'))
end
local fits = limit < 0 or pending == 0 or pending + tokens <= limit
if free - ahead >= weight and fits then
  local expires = now_ms + tonumber(ARGV[3])
  redis.call('ZADD', KEYS[1], expires, ARGV[2])
  for i = 2, weight do
    redis.call('ZADD', KEYS[1], expires, ARGV[2] .. '#' .. i)
  end
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2)
  if rank then
    redis.call('ZREM', KEYS[2], ARGV[2])
    redis.call('ZREM', KEYS[3], ARGV[2])
  end
  if tokens > 0 then
    redis.call('HSET', KEYS[4], ARGV[2], tokens)
    pending = redis.call('INCRBY', KEYS[5], tokens)
    redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[3]) * 2)
    redis.call('PEXPIRE', KEYS[5], tonumber(ARGV[3]) * 2)
  end
  return 1 + pending
end
if ARGV[4] == '1' then
  if not rank then
    if ahead >= tonumber(ARGV[7]) then
      return -1
    end
    redis.call('ZADD', KEYS[2], now_ms, ARGV[2])
  end
  redis.call('ZADD', KEYS[3], now_ms, ARGV[2])
  redis.call('PEXPIRE', KEYS[2], 60000)
  redis.call('PEXPIRE', KEYS[3], 60000)
end
return 0
"""
)

_RENEW_LUA = (
    NOW_MS
    + """
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now_ms + tonumber(ARGV[1]), ARGV[i])
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[1]) * 2)
end
return 1
"""
)

# KEYS: slots, queue, seen, pending hash, pending sum, the token's tombstone. ARGV: token,
# weight, ttl_ms. Takes a token whose acquire failed on the client side (or whose wait is over)
# out of the slots, the line and the pending tokens, and marks it gone for ttl_ms so that an
# acquire of it still on its way (another connection, a later pipeline) admits nothing.
_REMOVE_LUA = """
local token = ARGV[1]
redis.call('ZREM', KEYS[1], token)
for i = 2, tonumber(ARGV[2]) do
  redis.call('ZREM', KEYS[1], token .. '#' .. i)
end
redis.call('ZREM', KEYS[2], token)
redis.call('ZREM', KEYS[3], token)
local t = redis.call('HGET', KEYS[4], token)
if t then
  redis.call('HDEL', KEYS[4], token)
  redis.call('DECRBY', KEYS[5], t)
end
redis.call('SET', KEYS[6], '1', 'PX', tonumber(ARGV[3]))
return 1
"""

# KEYS: a pool's pending hash and pending sum. ARGV: a lease token. Its prompt tokens are no
# longer pending (first token, release or a failed acquire). Returns the pool's pending sum.
_FORGET_PENDING_LUA = """
local t = redis.call('HGET', KEYS[1], ARGV[1])
if t then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return redis.call('DECRBY', KEYS[2], t)
end
return tonumber(redis.call('GET', KEYS[2]) or '0')
"""

# KEYS: one pool's slots, queue and pending sum. Returns its live slots, waiters and pending
# prompt tokens.
_COUNT_LUA = (
    NOW_MS
    + """
return {
  redis.call('ZCOUNT', KEYS[1], '(' .. now_ms, '+inf'),
  redis.call('ZCARD', KEYS[2]),
  math.max(0, tonumber(redis.call('GET', KEYS[3]) or '0')),
}
"""
)

# KEYS: the route's breaker hash. ARGV: cooldown_ms, max_cooldown_ms. Returns ms until it ends.
_TRIP_LUA = (
    NOW_MS
    + """
local ends = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
local trips = redis.call('HINCRBY', KEYS[1], 'trips', 1)
local cooldown = math.min(tonumber(ARGV[2]), tonumber(ARGV[1]) * 2 ^ (trips - 1))
ends = math.max(ends, now_ms + cooldown)
redis.call('HSET', KEYS[1], 'until', ends)
redis.call('PEXPIRE', KEYS[1], math.floor(ends - now_ms + 2 * tonumber(ARGV[2])))
return math.floor(ends - now_ms)
"""
)

# KEYS: one breaker hash. Returns {ms left of its cooldown} (<= 0: over; nil: closed).
_CIRCUITS_LUA = (
    NOW_MS
    + """
local left = {}
for i = 1, #KEYS do
  local ends = redis.call('HGET', KEYS[i], 'until')
  left[i] = ends and (tonumber(ends) - now_ms) or false
end
return left
"""
)

# KEYS: one task's hash. ARGV: route, ok (1/0), ttl_ms, owner, extra_failed (1: the owner's
# early feedback on the request was waiting), the request's arrival (Unix ms). Returns the
# task's {route, ok, failed, owner, superseded, started} before, `failed` counting the owner's
# early failure feedback (an `early` mark left by EARLY_MARK); another caller's early mark is
# dropped. A request that arrived before the one the task is on (`started`) moves nothing but
# `failed`, and says `superseded` (1).
_SETTLE_TASK_LUA = """
local h = redis.call('HMGET', KEYS[1], 'route', 'ok', 'failed', 'owner', 'early', 'started')
local route = h[1] or ''
local failed = 0
if route ~= '' then failed = tonumber(h[3] or '0') end
if (h[5] and h[4] == ARGV[4]) or ARGV[5] == '1' then failed = 1 end
redis.call('HDEL', KEYS[1], 'early')
if route ~= '' and tonumber(h[6] or '0') > tonumber(ARGV[6]) then
  if failed == 1 then redis.call('HSET', KEYS[1], 'ok', 0, 'failed', 1) end
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {route, tonumber(h[2] or '0'), failed, h[4] or '', 1, h[6]}
end
local ok = (ARGV[2] == '1' and failed == 0) and 1 or 0
redis.call('HSET', KEYS[1], 'route', ARGV[1], 'ok', ok, 'failed', failed, 'owner', ARGV[4],
  'started', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if route == '' then return {'', 0, failed, '', 0, 0} end
return {route, tonumber(h[2] or '0'), failed, h[4] or '', 0, h[6] or 0}
"""

# KEYS: a request's hash (a request of a named task). ARGV: the task's name, ttl_ms, owner.
# The request now points at its task (`moved`), so feedback by request id finds it; returns 1
# when the owner's early failure feedback on the request was waiting there.
_LINK_REQUEST_LUA = """
local h = redis.call('HMGET', KEYS[1], 'owner', 'early')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'moved', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if h[2] and h[1] == ARGV[3] then return 1 end
return 0
"""

# KEYS: a task's (or request's) hash. ARGV: ok (1/0), ttl_ms, caller ('' for the admin).
# Returns {result, route, ok, failed, owner-or-target}: 'moved' (the request belongs to the
# task named in the last field), 'unsettled', 'not_owner', or 'applied' (a failure marks it).
_TASK_FEEDBACK_LUA = """
local h = redis.call('HMGET', KEYS[1], 'route', 'ok', 'failed', 'owner', 'moved')
if h[5] then return {'moved', '', 0, 0, h[5]} end
if not h[1] then return {'unsettled', '', 0, 0, ''} end
local owner = h[4] or ''
if ARGV[3] ~= '' and ARGV[3] ~= owner then return {'not_owner', h[1], 0, 0, owner} end
if ARGV[1] == '0' then
  redis.call('HSET', KEYS[1], 'ok', 0, 'failed', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {'applied', h[1], tonumber(h[2] or '0'), tonumber(h[3] or '0'), owner}
"""

# KEYS: a task's (or request's) hash not settled yet. ARGV: caller, keep_ms. Keeps the
# caller's early failure feedback for SETTLE_TASK / LINK_REQUEST; {'moved', task} or
# {'settled', ''} when that happened meanwhile, else {'kept', ''}.
_EARLY_MARK_LUA = """
local h = redis.call('HMGET', KEYS[1], 'route', 'moved')
if h[2] then return {'moved', h[2]} end
if h[1] then return {'settled', ''} end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'early', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {'kept', ''}
"""

# KEYS: a spend ledger (a float). ARGV: usd, cap_usd, ttl_ms. Adds `usd` and returns 1 only if
# the total stays within the cap; else 0, adding nothing. Counts across every replica.
_SPEND_LUA = """
local spent = tonumber(redis.call('GET', KEYS[1]) or '0')
if spent + tonumber(ARGV[1]) > tonumber(ARGV[2]) then return 0 end
redis.call('INCRBYFLOAT', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS: a spend ledger. ARGV: usd (may be negative). Adds it to a ledger that still exists
# (its TTL unchanged), never below 0.
_SETTLE_SPEND_LUA = """
local spent = redis.call('GET', KEYS[1])
if spent == false then return 0 end
local left = tonumber(spent) + tonumber(ARGV[1])
if left < 0 then left = 0 end
redis.call('SET', KEYS[1], tostring(left), 'KEEPTTL')
return 1
"""

# KEYS: the leader lease. ARGV: token, ttl_ms. Returns 1 when `token` leads (taken or renewed).
_LEAD_LUA = """
local holder = redis.call('GET', KEYS[1])
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: the leader lease. ARGV: token. Gives the lease up if `token` holds it.
_RESIGN_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS: the leader lease, the run hash, the history list (one hash slot: {canary}). ARGV: the
# leader's token ('' for an admin's write), the run's JSON, an event's JSON ('' for none), the
# history's bound, the version the writer read. Writes only if the version is unchanged and,
# for a leader, while it still holds the lease (a paused old leader is fenced out). Returns the
# new version, 0 when fenced out, -1 when the run changed since it was read.
_CANARY_WRITE_LUA = """
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local version = tonumber(redis.call('HGET', KEYS[2], 'version') or '0')
if version ~= tonumber(ARGV[5]) then
  return -1
end
redis.call('HSET', KEYS[2], 'json', ARGV[2], 'version', version + 1)
if ARGV[3] ~= '' then
  redis.call('LPUSH', KEYS[3], ARGV[3])
  redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[4]) - 1)
end
return version + 1
"""

# KEYS: one slice's hash (10 s, 1 min or 1 h). ARGV: its TTL in seconds, the number of integer
# fields n, then n (field, count) pairs added with HINCRBY, then (field, amount) pairs added
# with HINCRBYFLOAT. One key, so one hash slot: a single Redis and a cluster get the same calls
# (the flush sums each key's increments first, router/state/redis/series.py).
_MERGE_LUA = """
local floats_from = 3 + 2 * tonumber(ARGV[2])
for i = 3, floats_from - 1, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
for i = floats_from, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""


# KEYS: a DNS pool's members hash ('v': its version, 's:SLOT': an address, 't:ADDRESS': when
# last resolved, server ms). READ returns the server's ms and the hash; WRITE replaces the hash
# with ARGV[3..] (field, value pairs) if its version is still ARGV[1] (0: taken), kept ARGV[2] ms.
# The rule itself is router/state/members.py's, in Python, once for both stores.
_READ_MEMBERS_LUA = (
    NOW_MS
    + """
return {now_ms, redis.call('HGETALL', KEYS[1])}
"""
)
_WRITE_MEMBERS_LUA = """
if (redis.call('HGET', KEYS[1], 'v') or '0') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'v', tonumber(ARGV[1]) + 1, unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

ACQUIRE = Script(_ACQUIRE_LUA)
RENEW = Script(_RENEW_LUA)
REMOVE = Script(_REMOVE_LUA)
FORGET_PENDING = Script(_FORGET_PENDING_LUA)
COUNT = Script(_COUNT_LUA)
TRIP = Script(_TRIP_LUA)
CIRCUITS = Script(_CIRCUITS_LUA)
SETTLE_TASK = Script(_SETTLE_TASK_LUA)
LINK_REQUEST = Script(_LINK_REQUEST_LUA)
TASK_FEEDBACK = Script(_TASK_FEEDBACK_LUA)
EARLY_MARK = Script(_EARLY_MARK_LUA)
SPEND = Script(_SPEND_LUA)
SETTLE_SPEND = Script(_SETTLE_SPEND_LUA)
LEAD = Script(_LEAD_LUA)
RESIGN = Script(_RESIGN_LUA)
CANARY_WRITE = Script(_CANARY_WRITE_LUA)
MERGE = Script(_MERGE_LUA)
READ_MEMBERS = Script(_READ_MEMBERS_LUA)
WRITE_MEMBERS = Script(_WRITE_MEMBERS_LUA)
