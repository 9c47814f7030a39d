"""The cluster's Lua scripts: each is one atomic step in Redis.

Why Lua: placement must read every node's load and take a slot in one step, or two nodes
placing at once would both see the last free slot (Redis runs a script with nothing in
between). Each script takes one JSON argument and answers JSON; times are Redis's own
(`TIME`), so the nodes' clocks do not have to agree. Keys, under the cluster's prefix `P`:

- `P node:{tag}`: a node's record (hash: address, state, capacity, workers, media: its
  ICE/RTP addresses as JSON, sip: '1' where it serves SIP, so outbound SIP calls are placed
  there), with the TTL; it is also the node's claim on its tag;
- `P calls:{tag}`: the calls a node holds and the slots placed on it (sorted set: member,
  expiry in ms), with the TTL: a dead node's members and key vanish by themselves;
- `P tenant:{tenant}`: one key's calls and placed slots across the cluster (the same);
- `P secret:{sha256}`: an ephemeral secret (hash: state, tenant, expires, session);
- `P secrets:{tenant}`: one key's unused secrets (sorted set: sha256, expiry in ms).
"""

from __future__ import annotations

COMMON = """
local a = cjson.decode(ARGV[1])
local p = a.prefix
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function keep(key, ms)
  local left = redis.call('PTTL', key)
  if left >= 0 and left < ms then redis.call('PEXPIRE', key, ms) end
  if left == -1 then redis.call('PEXPIRE', key, ms) end
end
local function load_of(tag)
  local key = p .. 'calls:' .. tag
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  return redis.call('ZCARD', key)
end
"""

# The heartbeat: this node's record, its calls (added, refreshed, removed) and the node
# table as this node will route by it until the next heartbeat.
SYNC = COMMON + """
local nk = p .. 'node:' .. a.node
local ck = p .. 'calls:' .. a.node
if a.record then
  local r = a.record
  redis.call('HSET', nk, 'address', r.address, 'state', r.state, 'capacity', r.capacity,
             'workers', r.workers, 'media', r.media or '{}', 'seen', now)
  if r.sip then redis.call('HSET', nk, 'sip', r.sip) end
  redis.call('PEXPIRE', nk, a.ttl)
end
for _, m in ipairs(a.add) do
  redis.call('ZADD', ck, now + a.ttl, m[1])
  if m[2] ~= '' then
    local tk = p .. 'tenant:' .. m[2]
    redis.call('ZADD', tk, now + a.ttl, m[1])
    keep(tk, a.ttl)
  end
end
for _, m in ipairs(a.remove) do
  redis.call('ZREM', ck, m[1])
  if m[2] ~= '' then redis.call('ZREM', p .. 'tenant:' .. m[2], m[1]) end
end
if redis.call('EXISTS', ck) == 1 then keep(ck, a.ttl) end
local nodes = {}
for i = 1, #a.tags do
  local tag = string.sub(a.tags, i, i)
  local r = redis.call('HMGET', p .. 'node:' .. tag, 'address', 'state', 'capacity', 'media',
                      'sip')
  if r[1] then
    table.insert(nodes, {tag, r[1], r[2], tonumber(r[3]) or 0, load_of(tag), r[4] or '{}',
                         r[5] or '0'})
  end
end
return cjson.encode(nodes)
"""

# A new call: the tenant's limit and the least loaded serving node with room (for an
# outbound SIP call, `need_sip`: one that serves SIP), and a slot taken there (and in the
# tenant's set), all in one step.
PLACE = COMMON + """
local tk = p .. 'tenant:' .. a.tenant
if a.tenant_limit > 0 then
  redis.call('ZREMRANGEBYSCORE', tk, '-inf', now)
  if redis.call('ZCARD', tk) >= a.tenant_limit then
    return cjson.encode({'tenant_limit'})
  end
end
local best, best_score, sip_seen = nil, nil, false
for i = 1, #a.tags do
  local tag = string.sub(a.tags, i, i)
  local r = redis.call('HMGET', p .. 'node:' .. tag, 'state', 'capacity', 'sip')
  if a.need_sip and r[1] == 'serving' and r[3] == '1' then sip_seen = true end
  if r[1] == 'serving' and (not a.need_sip or r[3] == '1') then
    local load = load_of(tag)
    local capacity = tonumber(r[2]) or 0
    if capacity == 0 or load < capacity then
      local score = load
      if capacity > 0 then score = load / capacity end
      if best == nil or score < best_score or (score == best_score and tag == a.entry) then
        best, best_score = tag, score
      end
    end
  end
end
if best == nil and a.need_sip and not sip_seen then return cjson.encode({'no_sip'}) end
if best == nil then return cjson.encode({'full'}) end
local ck = p .. 'calls:' .. best
redis.call('ZADD', ck, now + a.hold, a.member)
keep(ck, a.ttl)
redis.call('ZADD', tk, now + a.hold, a.member)
keep(tk, a.hold)
return cjson.encode({'placed', best})
"""

# A placed slot becomes the call made in it, on the node that made it (or is given back:
# call = '').
SETTLE = COMMON + """
local tk = p .. 'tenant:' .. a.tenant
redis.call('ZREM', p .. 'calls:' .. a.node, a.member)
redis.call('ZREM', tk, a.member)
if a.call ~= '' then
  local ck = p .. 'calls:' .. a.owner
  redis.call('ZADD', ck, now + a.ttl, a.call)
  keep(ck, a.ttl)
  redis.call('ZADD', tk, now + a.ttl, a.call)
  keep(tk, a.ttl)
end
return cjson.encode({'settled'})
"""

# A minted secret, within its key's limit of unused secrets across the cluster.
MINT = COMMON + """
local sk = p .. 'secrets:' .. a.tenant
redis.call('ZREMRANGEBYSCORE', sk, '-inf', now)
if redis.call('ZCARD', sk) >= a.limit then return cjson.encode({'too_many_secrets'}) end
local k = p .. 'secret:' .. a.hash
redis.call('HSET', k, 'state', 'unused', 'tenant', a.tenant, 'expires', a.expires,
           'session', a.session)
redis.call('PEXPIREAT', k, a.expires)
redis.call('ZADD', sk, a.expires, a.hash)
keep(sk, math.max(1, a.expires - now))
return cjson.encode({'minted'})
"""

# Redeem (exactly once), peek (what a secret is, without spending it) or give back (the call
# could not be made).
SECRET = COMMON + """
local k = p .. 'secret:' .. a.hash
local r = redis.call('HMGET', k, 'state', 'tenant', 'expires', 'session')
if not r[1] then return cjson.encode({'unknown'}) end
if a.op == 'release' then
  if r[1] == 'used' then
    redis.call('HSET', k, 'state', 'unused')
    redis.call('ZADD', p .. 'secrets:' .. r[2], tonumber(r[3]), a.hash)
  end
  return cjson.encode({'released'})
end
if tonumber(r[3]) <= now then return cjson.encode({'expired'}) end
if a.op == 'redeem' then
  if r[1] ~= 'unused' then return cjson.encode({'used'}) end
  redis.call('HSET', k, 'state', 'used')
  redis.call('ZREM', p .. 'secrets:' .. r[2], a.hash)
end
return cjson.encode({r[1], r[2], tonumber(r[3]), r[4]})
"""
