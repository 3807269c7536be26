"""Lua scripts of the Redis backend (key layout: `keys.py`; semantics: `base.py`).

Each script runs atomically in Redis, so concurrent routers and indexers never see half a write,
and each operation is one round trip. Scripts only touch keys of one pool (one hash tag), so
they run on Redis Cluster too. ARGV[1] is always the pool's key base. Approximate-entry times are
the caller's wall clock in seconds.

Every known pod owns a *slot*; the forward index `m:<word>` maps a block key to a 32-bit mask of
the slots `32*word .. 32*word+31` holding it exactly, so a lookup reads one value per block (per
32 pods) instead of one per (block, pod). A pod's exact entries are also in its reverse hash
`x:<pod>` (block key -> media, each with its copies when more than one: "GPU", "GPU*2,CPU";
`keys.py`). Clearing a pod gives it a fresh slot at once and queues the old slot's reverse hash
(renamed `gc:<slot>`) for garbage collection: stale bits of a retired slot are never read
because no pod owns that slot, and they are erased in bounded steps by every later write (and
by the client until the queue is empty) before the slot is reused.
"""

from __future__ import annotations

from kvgate.directory.base import MAX_COPIES

GC_BUDGET = 1000  # garbage entries a write script reclaims on its way

_PRELUDE = """
local base = ARGV[1]
local registry = base .. 'pods'
local function reg_get(pod)
  local v = redis.call('HGET', registry, pod)
  if not v then return nil, nil end
  local sep = string.find(v, '|', 1, true)
  return tonumber(string.sub(v, 1, sep - 1)), string.sub(v, sep + 1)
end
local function reg_set(pod, slot, gen) redis.call('HSET', registry, pod, slot .. '|' .. gen) end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- The pod's generation wrote now: its writer is alive (`OWNER_SILENT`).
local function wrote(pod) redis.call('HSET', base .. 'seen', pod, now_ms()) end
local function new_slot()
  local s = redis.call('LPOP', base .. 'free')
  if s then return tonumber(s) end
  return redis.call('HINCRBY', base .. 'meta', 'next_slot', 1) - 1
end
-- A slot's bit in m:<word> is set exactly when the key is in the slot's x:<pod> (or gc:<slot>)
-- hash; so setting a bit that is clear, or clearing one that is set, is an addition (one
-- HINCRBY, no read). Masks are stored as unsigned 32-bit numbers; bit.* wraps them to int32.
local function set_bit(k, slot)
  redis.call('HINCRBY', base .. 'm:' .. math.floor(slot / 32), k, 2 ^ (slot % 32))
end
local function clear_bit(k, slot)
  local mk = base .. 'm:' .. math.floor(slot / 32)
  if redis.call('HINCRBY', mk, k, -(2 ^ (slot % 32))) == 0 then redis.call('HDEL', mk, k) end
end
local function retire(pod, slot)
  local x = base .. 'x:' .. pod
  if redis.call('EXISTS', x) == 1 then
    redis.call('RENAME', x, base .. 'gc:' .. slot)
    redis.call('RPUSH', base .. 'gcq', slot)
  else
    redis.call('RPUSH', base .. 'free', slot)
  end
  redis.call('UNLINK', base .. 'a:' .. pod)
end
local function tidy()
  -- a pool with no pods and no garbage leaves no key behind (e.g. after its deletion)
  if redis.call('EXISTS', registry, base .. 'gcq') == 0 then
    redis.call('DEL', base .. 'meta', base .. 'free', base .. 'seen')
  end
end
local function collect(budget)
  while budget > 0 do
    local s = redis.call('LINDEX', base .. 'gcq', 0)
    if not s then
      tidy()
      return 0
    end
    local g = base .. 'gc:' .. s
    local fields = redis.call('HRANDFIELD', g, math.min(budget, 1000))
    if #fields == 0 then
      redis.call('LPOP', base .. 'gcq')
      redis.call('RPUSH', base .. 'free', s)
    else
      local slot = tonumber(s)
      for _, k in ipairs(fields) do clear_bit(k, slot) end
      redis.call('HDEL', g, unpack(fields))
      budget = budget - #fields
    end
  end
  return 1
end
local function read_keys(at)
  -- ARGV[at] = key size; then the keys concatenated in ARGV[at + 1], or (size 0) one per arg
  local keys, size = {}, tonumber(ARGV[at])
  if size == 0 then
    for i = at + 1, #ARGV do keys[#keys + 1] = ARGV[i] end
  elseif ARGV[at + 1] then
    local chain = ARGV[at + 1]
    for i = 1, #chain, size do keys[#keys + 1] = string.sub(chain, i, i + size - 1) end
  end
  return keys
end
local function call_chunks(cmd, key, keys)
  for i = 1, #keys, 1000 do redis.call(cmd, key, unpack(keys, i, math.min(#keys, i + 999))) end
end
-- An x:<pod> value lists the key's media, each followed by '*<copies>' when it has more than
-- one ("GPU", "GPU*2,CPU"; media contain neither ',' nor '*'). `media` with `delta` copies of
-- `medium` (1 or -1; MAX_COPIES at most; a medium without copies is left out, '' when none is).
local function media_copies(media, medium, delta)
  local out, found = {}, false
  for entry in string.gmatch(media, '[^,]+') do
    local star = string.find(entry, '*', 1, true)
    local m = star and string.sub(entry, 1, star - 1) or entry
    if m == medium then
      found = true
      local n = math.min((star and tonumber(string.sub(entry, star + 1)) or 1) + delta, MAX_COPIES)
      if n == 1 then
        out[#out + 1] = m
      elseif n > 1 then
        out[#out + 1] = m .. '*' .. n
      end
    else
      out[#out + 1] = entry
    end
  end
  if not found and delta > 0 then out[#out + 1] = medium end
  return table.concat(out, ',')
end
""".replace("MAX_COPIES", str(MAX_COPIES))


def _script(body: str) -> str:
    return "redis.replicate_commands()\n" + _PRELUDE + body


# ARGV: base, now, npods (-1 = every known pod), pods..., key size, chain
# The chain is the block keys concatenated (all `key size` bytes long; one argument is much
# cheaper to send and parse than thousands); key size 0 means one key per argument instead. Returns a flat array pod, count, ... (pods with
# count 0 left out). Chunks of the chain are read with one HMGET per 32-slot word (growing 4x,
# so short matches cost little); a running AND of each word's mask drops pods at their first
# missing block. Pods with approximate entries are also checked per key against their ZSET.
LOOKUP = _script("""
local band = bit.band
local now, npods = tonumber(ARGV[2]), tonumber(ARGV[3])
local chosen, pods_end = {}, 3
if npods < 0 then
  local flat = redis.call('HGETALL', registry)
  for i = 1, #flat, 2 do
    local v = flat[i + 1]
    chosen[#chosen + 1] = {flat[i], tonumber(string.sub(v, 1, string.find(v, '|', 1, true) - 1))}
  end
else
  for i = 4, 3 + npods do
    local slot = reg_get(ARGV[i])
    if slot then chosen[#chosen + 1] = {ARGV[i], slot} end
  end
  pods_end = 3 + npods
end
local keys = read_keys(pods_end + 1)
local nkeys = #keys
local words, wordlist, approx = {}, {}, {}
for _, c in ipairs(chosen) do
  local pod, slot = c[1], c[2]
  local b, w = bit.lshift(1, slot % 32), math.floor(slot / 32)
  local st = words[w]
  if not st then
    st = {w = w, active = 0, pods = {}, vals = {}}
    words[w] = st
    wordlist[#wordlist + 1] = st
  end
  local zkey = base .. 'a:' .. pod
  if redis.call('EXISTS', zkey) == 1 then
    approx[#approx + 1] = {pod = pod, st = st, b = b, zkey = zkey, count = 0}
  else
    st.active = bit.bor(st.active, b)
    st.pods[#st.pods + 1] = {pod, b, 0}
  end
end
-- Exact pods: per word, scan while any pod of the word still matches. A pod's count is
-- the index of the block where its bit dropped out (or every block scanned).
local fetched = 0  -- blocks of the chain whose masks are in st.vals (for every word)
local function fetch(upto)
  for _, st in ipairs(wordlist) do
    local got = redis.call('HMGET', base .. 'm:' .. st.w, unpack(keys, fetched + 1, upto))
    for i = 1, #got do st.vals[fetched + i] = got[i] end  -- raw: false or the mask as a string
  end
  fetched = upto
end
local width = 64
local function scanned_to(i)
  while i > fetched and fetched < nkeys do
    fetch(math.min(nkeys, fetched + width))
    width = math.min(width * 4, 2048)
  end
end
for _, st in ipairs(wordlist) do
  local active, i, same = st.active, 0, nil
  local vals = st.vals
  while active ~= 0 and i < nkeys do
    i = i + 1
    if i > fetched then scanned_to(i) end
    local v = vals[i]
    -- a run of blocks held by the same pods has equal (interned) mask strings: once a mask
    -- leaves `active` unchanged, equal masks will too, so most blocks cost one comparison
    if v ~= same then
      local kept = band(active, tonumber(v) or 0)
      if kept ~= active then
        for _, p in ipairs(st.pods) do
          if band(active, p[2]) ~= 0 and band(kept, p[2]) == 0 then p[3] = i - 1 end
        end
        active = kept
      end
      same = v
    end
  end
  for _, p in ipairs(st.pods) do
    if band(active, p[2]) ~= 0 then p[3] = i end
  end
end
-- Pods with approximate entries: a block counts if held exactly or by an unexpired entry.
for _, a in ipairs(approx) do
  local i, scores, from = 0, {}, 0
  while i < nkeys do
    i = i + 1
    scanned_to(i)
    if i > from then
      -- up to where the masks are fetched, but at most 2,048 keys a call: Lua unpacks at
      -- most ~8,000 values, and a chain of more blocks failed every lookup
      local upto = math.min(nkeys, i + 2047, math.max(fetched, i + 63))
      local got = redis.call('ZMSCORE', a.zkey, unpack(keys, i, upto))
      for j = 1, #got do scores[i + j - 1] = got[j] end
      from = upto
    end
    local s = scores[i]
    if band(tonumber(a.st.vals[i]) or 0, a.b) == 0 and not (s and tonumber(s) > now) then
      i = i - 1
      break
    end
  end
  a.count = i
end
local out = {}
for _, st in ipairs(wordlist) do
  for _, p in ipairs(st.pods) do
    if p[3] > 0 then
      out[#out + 1] = p[1]
      out[#out + 1] = p[3]
    end
  end
end
for _, a in ipairs(approx) do
  if a.count > 0 then
    out[#out + 1] = a.pod
    out[#out + 1] = a.count
  end
end
return out
""")

# ARGV: base, medium, approximate counts (1/0), now, npods (-1 = every known pod), pods...,
# key size, chain (as in LOOKUP). Counts per pod the leading blocks held in `medium` (its x:
# hash lists the medium, with copies or not) or, when approximate entries count, by an unexpired
# one. One HMGET (and ZMSCORE) per pod per chunk of the chain (growing 4x from 64), stopping at
# the pod's first miss.
LOOKUP_MEDIUM = _script("""
local needle, approx_counts = ',' .. ARGV[2] .. ',', ARGV[3] == '1'
local needle_copies = ',' .. ARGV[2] .. '*'
local now, npods = tonumber(ARGV[4]), tonumber(ARGV[5])
local pods = {}
if npods < 0 then
  pods = redis.call('HKEYS', registry)
else
  for i = 6, 5 + npods do
    if redis.call('HEXISTS', registry, ARGV[i]) == 1 then pods[#pods + 1] = ARGV[i] end
  end
end
local keys = read_keys(6 + math.max(npods, 0))
local nkeys = #keys
local out = {}
for _, pod in ipairs(pods) do
  local x, z = base .. 'x:' .. pod, base .. 'a:' .. pod
  local zset = approx_counts and redis.call('EXISTS', z) == 1
  local n, i, width, missed = 0, 1, 64, false
  while not missed and i <= nkeys do
    local upto = math.min(nkeys, i + width - 1)
    local media = redis.call('HMGET', x, unpack(keys, i, upto))
    local scores = zset and redis.call('ZMSCORE', z, unpack(keys, i, upto))
    for j = 1, #media do
      local m = media[j] and ',' .. media[j] .. ','
      local held = m and (string.find(m, needle, 1, true) or string.find(m, needle_copies, 1, true))
      if not held and scores then
        local s = scores[j]
        held = s and tonumber(s) > now
      end
      if not held then
        missed = true
        break
      end
      n = n + 1
    end
    i, width = upto + 1, math.min(width * 4, 2048)
  end
  if n > 0 then
    out[#out + 1] = pod
    out[#out + 1] = n
  end
end
return out
""")

# ARGV: base, pod, generation ('' = none), medium, cap, key size, keys (as in LOOKUP)
# A key held in `medium` already gains a copy. Returns 1 when applied, 0 for a stale generation.
ADD = _script("""
local pod, gen, medium = ARGV[2], ARGV[3], ARGV[4]
local slot, cur = reg_get(pod)
if not slot then
  slot = new_slot()
  reg_set(pod, slot, gen)
elseif gen ~= '' then
  if cur == '' then
    reg_set(pod, slot, gen)
  elseif cur ~= gen then
    collect(GC_BUDGET)
    return 0
  end
end
local x = base .. 'x:' .. pod
local keys = read_keys(6)
for _, k in ipairs(keys) do
  if redis.call('HSETNX', x, k, medium) == 1 then
    set_bit(k, slot)
  else
    local media = redis.call('HGET', x, k)
    local more = media_copies(media, medium, 1)
    if more ~= media then redis.call('HSET', x, k, more) end
  end
end
local z = base .. 'a:' .. pod
if #keys > 0 and redis.call('EXISTS', z) == 1 then call_chunks('ZREM', z, keys) end
local excess = redis.call('HLEN', x) - tonumber(ARGV[5])
while excess > 0 do
  local victims = redis.call('HRANDFIELD', x, math.min(excess, 1000))
  for _, k in ipairs(victims) do clear_bit(k, slot) end
  redis.call('HDEL', x, unpack(victims))
  excess = excess - #victims
end
if gen ~= '' then wrote(pod) end
collect(GC_BUDGET)
return 1
""").replace("GC_BUDGET", str(GC_BUDGET))

# ARGV: base, pod, generation ('' = any), medium, key size, keys (as in LOOKUP)
# Each key drops one copy in `medium`; the last copy of the last medium drops the key.
REMOVE = _script("""
local pod, gen, medium = ARGV[2], ARGV[3], ARGV[4]
local slot, cur = reg_get(pod)
if not slot then return 1 end
if gen ~= '' and cur ~= '' and cur ~= gen then return 0 end
local x = base .. 'x:' .. pod
local keys = read_keys(5)
for _, k in ipairs(keys) do
  local media = redis.call('HGET', x, k)
  if media then
    local left = media_copies(media, medium, -1)
    if left == '' then
      redis.call('HDEL', x, k)
      clear_bit(k, slot)
    elseif left ~= media then
      redis.call('HSET', x, k, left)
    end
  end
end
local z = base .. 'a:' .. pod
if #keys > 0 and redis.call('EXISTS', z) == 1 then call_chunks('ZREM', z, keys) end
if gen ~= '' and cur == gen then wrote(pod) end
collect(GC_BUDGET)
return 1
""").replace("GC_BUDGET", str(GC_BUDGET))

# ARGV: base, pod, now, expiry, cap, ttl_ms, slot ('' = any), key size, keys (as in LOOKUP)
# Collects expired entries, skips keys held exactly, evicts the soonest-expiring over the cap,
# and keeps the ZSET's own TTL at least as long as its newest entry so an idle pool's routing
# history disappears entirely. Returns the pod's slot. Without a slot an unknown pod is
# registered; with one (a long history's later chunks) the pod must still hold it, else nothing
# is written and -1 returned: a pod forgotten between two chunks stays forgotten.
ADD_APPROXIMATE = _script("""
local pod = ARGV[2]
local slot = reg_get(pod)
if ARGV[7] ~= '' then
  if slot ~= tonumber(ARGV[7]) then return -1 end
elseif not slot then
  slot = new_slot()
  reg_set(pod, slot, '')
end
local x, z = base .. 'x:' .. pod, base .. 'a:' .. pod
redis.call('ZREMRANGEBYSCORE', z, '-inf', ARGV[3])
local args = {}
for _, k in ipairs(read_keys(8)) do
  if redis.call('HEXISTS', x, k) == 0 then
    args[#args + 1] = ARGV[4]
    args[#args + 1] = k
    if #args >= 2000 then
      redis.call('ZADD', z, unpack(args))
      args = {}
    end
  end
end
if #args > 0 then redis.call('ZADD', z, unpack(args)) end
local excess = redis.call('ZCARD', z) - tonumber(ARGV[5])
if excess > 0 then redis.call('ZPOPMIN', z, excess) end
local ttl = tonumber(ARGV[6])
local pttl = redis.call('PTTL', z)
if pttl ~= -2 and pttl < ttl then redis.call('PEXPIRE', z, ttl) end
return slot
""")

# ARGV: base, pod, generation. Returns 1 when it changed.
SET_GENERATION = _script("""
local pod, gen = ARGV[2], ARGV[3]
local slot, cur = reg_get(pod)
if cur == gen then return 0 end
if not slot then
  reg_set(pod, new_slot(), gen)
elseif cur == '' then
  reg_set(pod, slot, gen)
else
  retire(pod, slot)
  reg_set(pod, new_slot(), gen)
end
wrote(pod)
return 1
""")

# ARGV: base, pod, generation, silence (ms). 1 when the pod's generation is another writer's and
# none of its writes applied for `silence`: that writer stopped (`BlockIndex.owner_silent`).
OWNER_SILENT = _script("""
local pod, gen = ARGV[2], ARGV[3]
local slot, cur = reg_get(pod)
if not slot or cur == '' or cur == gen then return 0 end
local seen = tonumber(redis.call('HGET', base .. 'seen', pod) or '0')
if now_ms() - seen < tonumber(ARGV[4]) then return 0 end
return 1
""")

# ARGV: base, pod, forget (1 = also drop the generation), generation ('' = any: else only while it
# is the pod's). Entries vanish at once.
CLEAR = _script("""
local pod = ARGV[2]
local slot, cur = reg_get(pod)
if not slot then return 0 end
if ARGV[4] ~= '' and cur ~= '' and cur ~= ARGV[4] then return 0 end
retire(pod, slot)
if ARGV[3] == '1' then
  redis.call('HDEL', registry, pod)
  redis.call('HDEL', base .. 'seen', pod)
else
  reg_set(pod, new_slot(), cur)
end
return 1
""")

# ARGV: base, budget. Reclaims garbage of cleared pods; returns 1 while some remains.
COLLECT = _script("""
return collect(tonumber(ARGV[2]))
""")

# ARGV: base, token, ttl (s), pods... Returns {epoch, missing pods...}: the pool's epoch (set to
# `token` if it had none: a new pool, or a store that lost its data), and which of `pods` the
# registry lacks. O(pods asked), whatever the registry holds. The epoch outlives a pool with
# no pod (a pod replaced: not data lost) and expires `ttl` after the last audit of a pool gone.
AUDIT = _script("""
local k = base .. 'epoch'
redis.call('SET', k, ARGV[2], 'NX')
redis.call('EXPIRE', k, tonumber(ARGV[3]))
local out = {redis.call('GET', k)}
for i = 4, #ARGV do
  if redis.call('HEXISTS', registry, ARGV[i]) == 0 then out[#out + 1] = ARGV[i] end
end
return out
""")

# ARGV: base, max pods. Returns {pods, exact entries, approximate entries}, the entries summed
# over at most `max pods` of the registry's pods (a registry that large is broken or
# hostile: its stats cost no more than that).
STATS = _script("""
local pods = redis.call('HLEN', registry)
local names = redis.call('HSCAN', registry, 0, 'COUNT', tonumber(ARGV[2]))[2]
local exact, approx = 0, 0
for i = 1, math.min(#names, 2 * tonumber(ARGV[2])), 2 do
  exact = exact + redis.call('HLEN', base .. 'x:' .. names[i])
  approx = approx + redis.call('ZCARD', base .. 'a:' .. names[i])
end
return {pods, exact, approx}
""")
