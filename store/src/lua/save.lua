-- Writes the run document and its new status, if the caller still holds the lease and nobody
-- cancelled the run (then only `cancelled` may be written), with the audit entries of what
-- changed and the announcements of it.
-- ARGV (after the common three): 4 owner, 5 lease_ms, 6 status, 7 doc, 8 ttl_secs, 9 turn,
-- 10 n, then n (call_id, held call JSON) of the calls a pause holds for a person, then the
-- audit entries and the announcements.
local h = redis.call('HMGET', KEYS[1], 'status', 'lease_owner', 'cancel')
if h[2] ~= ARGV[4] or (h[1] ~= 'running' and h[1] ~= 'resuming') then
  return {'lost', h[1] or ''}
end
-- A run someone cancelled goes nowhere but to cancelled.
if h[3] and ARGV[6] ~= 'cancelled' then return {'cancel', ''} end
check_mark(ARGV[3])
local st = ARGV[6]
local now = now_ms()
redis.call('HSET', KEYS[1], 'status', st, 'doc', ARGV[7], 'updated_at', now)
if st == 'running' or st == 'resuming' then
  redis.call('HSET', KEYS[1], 'lease_until', now + tonumber(ARGV[5]))
else
  redis.call('HSET', KEYS[1], 'lease_owner', '', 'lease_until', 0)
end
local n = tonumber(ARGV[10])
if st == 'awaiting_approval' then
  redis.call('HSET', KEYS[1], 'turn', ARGV[9], 'pending_count', n, 'decided_count', 0)
  for i = 11, 10 + 2 * n, 2 do
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  end
end
outbox_args(append_audits(11 + 2 * n))
local ttl = tonumber(ARGV[8])
if ttl > 0 then
  for i = 1, #KEYS do
    if i ~= 7 then redis.call('EXPIRE', KEYS[i], ttl) end
  end
end
redis.call('HINCRBY', KEYS[1], 'version', 1)
return reply('ok', '')
