package redisbus

import "github.com/redis/go-redis/v9"

// Key layout of one session (the {session} hash tag keeps every key in one
// Redis Cluster slot, which the scripts need):
//
//	<prefix>{<session>}:m          hash: epoch, last (last id), first (oldest id held), bytes (envelope bytes held)
//	<prefix>{<session>}:s:<epoch>  stream: entry "<id>-0" with fields t (type) and j (JSON envelope)
//	<prefix>{<session>}:i:<epoch>  hash: idempotency key -> "<id> <expiresAtMillis> <fingerprint>"
//	<prefix>{<session>}:x:<epoch>  sorted set: idempotency key, scored by expiresAtMillis
//
// The epoch is part of the stream's name, so a reader of one epoch can never
// be handed an entry of another: after a lost stream (Redis restarted without
// persistence, a key evicted or expired) the ids restart at 1 in a stream
// with a different name. The idempotency records are per epoch for the same
// reason: a key names an event of one log, and a new log forgets them.
//
// Every script takes KEYS = {meta, stream prefix, idempotency hash prefix,
// idempotency set prefix}: the names without the epoch, which only the
// script knows for sure.
//
// Numbers cross the Lua boundary as decimal strings formatted with %d: Lua
// 5.1's tostring writes 1e+15 for large integers.

// luaPrelude reads the meta hash and decides the epoch: a missing meta hash,
// or one whose stream is gone although it holds ids, starts a new epoch
// (ARGV[1], from crypto/rand) with ids from 1, and forgets the idempotency
// records of the old one.
const luaPrelude = `
local meta, prefix = KEYS[1], KEYS[2]
local m = redis.call('HMGET', meta, 'epoch', 'last', 'first', 'bytes')
local epoch = m[1]
local last = tonumber(m[2]) or 0
local first = tonumber(m[3]) or 0
local bytes = tonumber(m[4]) or 0
if epoch and last > 0 and redis.call('EXISTS', prefix .. epoch) == 0 then
  epoch = false
end
local fresh = false
if not epoch then
  if m[1] then redis.call('DEL', KEYS[3] .. m[1], KEYS[4] .. m[1]) end
  epoch, last, first, bytes, fresh = ARGV[1], 0, 0, 0, true
end
local function d(n) return string.format('%d', n) end
`

// publishSrc assigns the next id, XADDs the envelope and trims the stream
// to the ring's bounds, atomically. With an idempotency key (ARGV[8] not
// empty) it first looks the key up in the epoch's records: a live record
// with the same fingerprint answers the first publish's id and appends
// nothing; one with another fingerprint is the error KEYREUSED. Otherwise
// the publish records the key, expiring after the window (ARGV[10] ms, on
// Redis's clock), and forgets up to 64 expired records (each record is
// forgotten once, so this keeps up with the records made).
//
//	ARGV: newEpoch, type, tail (envelope after `{"id":N`), maxLen, maxBytes, maxEventBytes, ttlMillis,
//	      key ("" for none), fingerprint, windowMillis
//	reply: {id, epoch, "1" for a duplicate else "0"}, or the error "TOOLARGE <bytes>" (no id used)
//	       or "KEYREUSED <first id>"
const publishSrc = luaPrelude + `
local key, fp = ARGV[8], ARGV[9]
local ik, xk, now
if key ~= '' then
  ik, xk = KEYS[3] .. epoch, KEYS[4] .. epoch
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local rec = redis.call('HGET', ik, key)
  if rec then
    local rid, rexp, rfp = string.match(rec, '^(%d+) (%d+) (.*)$')
    if rid and tonumber(rexp) > now then
      if rfp == fp then return {rid, epoch, '1'} end
      return redis.error_reply('KEYREUSED ' .. rid)
    end
  end
end
local id = last + 1
local env = '{"id":' .. d(id) .. ARGV[3]
if #env > tonumber(ARGV[6]) then
  return redis.error_reply('TOOLARGE ' .. #env)
end
local sk = prefix .. epoch
redis.call('XADD', sk, d(id) .. '-0', 't', ARGV[2], 'j', env)
bytes = bytes + #env
if first == 0 then first = id end
last = id
local maxLen, maxBytes = tonumber(ARGV[4]), tonumber(ARGV[5])
local nf = first
if last - nf + 1 > maxLen then nf = last - maxLen + 1 end
if nf > first then
  -- the count bound drops [first, nf): subtract their bytes
  for _, e in ipairs(redis.call('XRANGE', sk, d(first) .. '-0', d(nf - 1) .. '-0')) do
    bytes = bytes - #e[2][4]
  end
end
-- the byte bound drops the oldest entries; the newest always stays
while bytes > maxBytes and nf < last do
  local batch = redis.call('XRANGE', sk, d(nf) .. '-0', d(last - 1) .. '-0', 'COUNT', 128)
  if #batch == 0 then break end
  for _, e in ipairs(batch) do
    if bytes <= maxBytes then break end
    bytes = bytes - #e[2][4]
    nf = tonumber(string.match(e[1], '^(%d+)')) + 1
  end
end
if nf > first then
  redis.call('XTRIM', sk, 'MINID', d(nf) .. '-0')
  first = nf
end
if fresh then redis.call('DEL', meta) end
redis.call('HSET', meta, 'epoch', epoch, 'last', d(last), 'first', d(first), 'bytes', d(bytes))
local ttl = tonumber(ARGV[7])
if ttl > 0 then
  redis.call('PEXPIRE', meta, ttl)
  redis.call('PEXPIRE', sk, ttl)
end
if key ~= '' then
  local win = tonumber(ARGV[10])
  local old = redis.call('ZRANGEBYSCORE', xk, '-inf', d(now), 'LIMIT', 0, 64)
  if #old > 0 then
    redis.call('HDEL', ik, unpack(old))
    redis.call('ZREM', xk, unpack(old))
  end
  redis.call('HSET', ik, key, d(id) .. ' ' .. d(now + win) .. ' ' .. fp)
  redis.call('ZADD', xk, d(now + win), key)
  -- the records' keys outlive the latest expiry by at most a second (a
  -- replica with a shorter window never cuts a longer one's records), and
  -- are set once a second rather than on every publish
  if redis.call('PTTL', ik) < win or redis.call('PTTL', xk) < win then
    redis.call('PEXPIRE', ik, win + 1000)
    redis.call('PEXPIRE', xk, win + 1000)
  end
end
return {d(id), epoch, '0'}
`

var publishScript = redis.NewScript(publishSrc)

// ensureScript returns a session's epoch and last id, creating the epoch
// when there is none (or the stream is lost). A replica calls it before it
// builds a mirror, so the mirror's epoch is the one later publishes use.
//
//	ARGV: newEpoch, ttlMillis
//	reply: {epoch, last}
var ensureScript = redis.NewScript(luaPrelude + `
if fresh then
  redis.call('DEL', meta)
  redis.call('HSET', meta, 'epoch', epoch, 'last', '0', 'first', '0', 'bytes', '0')
end
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('PEXPIRE', meta, ttl)
  if last > 0 then redis.call('PEXPIRE', prefix .. epoch, ttl) end
end
return {epoch, d(last)}
`)

// deleteScript forgets a session: its stream, its idempotency records and
// its meta hash. The next use starts a new epoch.
var deleteScript = redis.NewScript(`
local e = redis.call('HGET', KEYS[1], 'epoch')
if e then redis.call('DEL', KEYS[2] .. e, KEYS[3] .. e, KEYS[4] .. e) end
return redis.call('DEL', KEYS[1])
`)

// epochScript returns a session's current epoch as the other scripts
// decide it, without creating one: "" when the meta hash is missing, or
// when it holds ids but its stream is gone (the next publish starts a new
// epoch then). Readers and new streams compare it with their mirror's.
//
//	reply: epoch or ""
var epochScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[1], 'epoch', 'last')
if not m[1] then return '' end
if (tonumber(m[2]) or 0) > 0 and redis.call('EXISTS', KEYS[2] .. m[1]) == 0 then return '' end
return m[1]
`)
