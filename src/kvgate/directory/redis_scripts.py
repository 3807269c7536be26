"""Lua scripts of the Redis backend (key layout: `keys.py`; semantics: `base.py`).

Each script runs atomically in Redis, so concurrent routers and indexers never see half a write,
and each operation is one round trip. Scripts only touch keys of one pool (one hash tag), so
they run on Redis Cluster too. Approximate-entry times are the caller's wall clock in seconds.
"""

from __future__ import annotations

# KEYS[1] registry. ARGV: base, now, npods (-1 = every known pod), pods..., block keys...
# Returns a flat array pod, count, pod, count, ... (pods with count 0 are left out).
# For each pod still matching, probe the next chunk of the chain with HMGET (and ZMSCORE when
# the pod has approximate entries); a pod leaves at its first missing block. Chunks grow 4x so
# short matches cost little and a 2,048-block match takes four probes per pod.
LOOKUP = """
local base, now, npods = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local first, pods = 4, nil
if npods < 0 then
  pods = redis.call('HKEYS', KEYS[1])
else
  pods = {}
  for i = 4, 3 + npods do
    if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then pods[#pods + 1] = ARGV[i] end
  end
  first = 4 + npods
end
local nkeys = #ARGV - first + 1
local active = {}
for _, pod in ipairs(pods) do
  local approx = base .. 'a:' .. pod
  if redis.call('EXISTS', approx) == 0 then approx = false end
  active[#active + 1] = {pod, base .. 'x:' .. pod, approx}
end
local out = {}
local done, width = 0, 32
while #active > 0 and done < nkeys do
  local stop = math.min(nkeys, done + width)
  local n = stop - done
  local survivors = {}
  for _, a in ipairs(active) do
    local held = redis.call('HMGET', a[2], unpack(ARGV, first + done, first + stop - 1))
    local scores = false
    if a[3] then
      scores = redis.call('ZMSCORE', a[3], unpack(ARGV, first + done, first + stop - 1))
    end
    local j = 1
    while j <= n do
      if not held[j] and not (scores and scores[j] and tonumber(scores[j]) > now) then break end
      j = j + 1
    end
    if j > n then
      survivors[#survivors + 1] = a
    elseif done + j > 1 then
      out[#out + 1] = a[1]
      out[#out + 1] = done + j - 1
    end
  end
  active = survivors
  done = stop
  width = math.min(width * 4, 2048)
end
if done > 0 then
  for _, a in ipairs(active) do
    out[#out + 1] = a[1]
    out[#out + 1] = done
  end
end
return out
"""

# KEYS registry, exact, approx. ARGV: pod, generation ('' = none), medium, cap, block keys...
# Returns 1 when applied, 0 for a stale generation.
ADD = """
redis.replicate_commands()
local cur, gen = redis.call('HGET', KEYS[1], ARGV[1]), ARGV[2]
if not cur or (cur == '' and gen ~= '') then
  redis.call('HSET', KEYS[1], ARGV[1], gen)
elseif gen ~= '' and cur ~= gen then
  return 0
end
local x, medium = KEYS[2], ARGV[3]
local needle = ',' .. medium .. ','
for i = 5, #ARGV do
  if redis.call('HSETNX', x, ARGV[i], medium) == 0 then
    local media = redis.call('HGET', x, ARGV[i])
    if not string.find(',' .. media .. ',', needle, 1, true) then
      redis.call('HSET', x, ARGV[i], media .. ',' .. medium)
    end
  end
end
if #ARGV >= 5 and redis.call('EXISTS', KEYS[3]) == 1 then
  for i = 5, #ARGV, 1000 do
    redis.call('ZREM', KEYS[3], unpack(ARGV, i, math.min(#ARGV, i + 999)))
  end
end
local excess = redis.call('HLEN', x) - tonumber(ARGV[4])
while excess > 0 do
  local victims = redis.call('HRANDFIELD', x, math.min(excess, 1000))
  redis.call('HDEL', x, unpack(victims))
  excess = excess - #victims
end
return 1
"""

# KEYS registry, exact, approx. ARGV: pod, generation ('' = any), medium, block keys...
REMOVE = """
local cur, gen = redis.call('HGET', KEYS[1], ARGV[1]), ARGV[2]
if not cur then return 1 end
if gen ~= '' and cur ~= '' and cur ~= gen then return 0 end
local x, medium = KEYS[2], ARGV[3]
for i = 4, #ARGV do
  local media = redis.call('HGET', x, ARGV[i])
  if media then
    if media == medium then
      redis.call('HDEL', x, ARGV[i])
    else
      local left = {}
      for m in string.gmatch(media, '[^,]+') do
        if m ~= medium then left[#left + 1] = m end
      end
      if #left == 0 then
        redis.call('HDEL', x, ARGV[i])
      else
        redis.call('HSET', x, ARGV[i], table.concat(left, ','))
      end
    end
  end
end
if #ARGV >= 4 and redis.call('EXISTS', KEYS[3]) == 1 then
  for i = 4, #ARGV, 1000 do
    redis.call('ZREM', KEYS[3], unpack(ARGV, i, math.min(#ARGV, i + 999)))
  end
end
return 1
"""

# KEYS registry, exact, approx. ARGV: pod, now, expiry, cap, ttl_ms, block keys...
# Collects expired entries, skips keys held exactly, evicts the soonest-expiring over the cap,
# and keeps the ZSET's own TTL at least as long as its newest entry so an idle pool vanishes.
ADD_APPROXIMATE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then redis.call('HSET', KEYS[1], ARGV[1], '') end
local z = KEYS[3]
redis.call('ZREMRANGEBYSCORE', z, '-inf', ARGV[2])
local args = {}
for i = 6, #ARGV do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then
    args[#args + 1] = ARGV[3]
    args[#args + 1] = ARGV[i]
    if #args >= 2000 then
      redis.call('ZADD', z, unpack(args))
      args = {}
    end
  end
end
if #args > 0 then redis.call('ZADD', z, unpack(args)) end
local excess = redis.call('ZCARD', z) - tonumber(ARGV[4])
if excess > 0 then redis.call('ZPOPMIN', z, excess) end
local ttl = tonumber(ARGV[5])
local pttl = redis.call('PTTL', z)
if pttl ~= -2 and pttl < ttl then redis.call('PEXPIRE', z, ttl) end
return 1
"""

# KEYS registry, exact, approx. ARGV: pod, generation. Returns 1 when it changed.
SET_GENERATION = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur == ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if cur and cur ~= '' then redis.call('UNLINK', KEYS[2], KEYS[3]) end
return 1
"""
