package redisbus

import "github.com/redis/go-redis/v9"

// Key layout of one session (the {session} hash tag keeps both keys in one
// Redis Cluster slot, which the scripts need):
//
//	<prefix>{<session>}:m          hash: epoch, last (last id), first (oldest id held), bytes (envelope bytes held)
//	<prefix>{<session>}:s:<epoch>  stream: entry "<id>-0" with fields t (type) and j (JSON envelope)
//
// The epoch is part of the stream's name, so a reader of one epoch can never
// be handed an entry of another: after a lost stream (Redis restarted without
// persistence, a key evicted or expired) the ids restart at 1 in a stream
// with a different name.
//
// Numbers cross the Lua boundary as decimal strings formatted with %d: Lua
// 5.1's tostring writes 1e+15 for large integers.

// luaPrelude reads the meta hash and decides the epoch: a missing meta hash,
// or one whose stream is gone although it holds ids, starts a new epoch
// (ARGV[1], from crypto/rand) with ids from 1.
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
  epoch, last, first, bytes, fresh = ARGV[1], 0, 0, 0, true
end
local function d(n) return string.format('%d', n) end
`

// publishScript assigns the next id, XADDs the envelope and trims the
// stream to the ring's bounds, atomically.
//
//	ARGV: newEpoch, type, tail (envelope after `{"id":N`), maxLen, maxBytes, maxEventBytes, ttlMillis
//	reply: {id, epoch}, or the error "TOOLARGE <bytes>" (no id used)
var publishScript = redis.NewScript(luaPrelude + `
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
return {d(id), epoch}
`)

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

// deleteScript forgets a session: its stream and its meta hash. The next
// use starts a new epoch.
var deleteScript = redis.NewScript(`
local e = redis.call('HGET', KEYS[1], 'epoch')
if e then redis.call('DEL', KEYS[2] .. e) end
return redis.call('DEL', KEYS[1])
`)
