-- Writes the run document and its new status, if the caller still holds the lease and nobody
-- cancelled the run (then only `cancelled` may be written), with the audit entries of what
-- changed and the announcements of it.
-- Tail: the terms of each call a pause holds for a person (`held`, then that many
-- `read_held_terms`), then the audit entries and the announcements.
local h = redis.call('HMGET', run_key, 'status', 'lease_owner', 'cancel')
if h[2] ~= owner or (h[1] ~= 'running' and h[1] ~= 'resuming') then
  return {'lost', h[1] or ''}
end
-- A run someone cancelled goes nowhere but to cancelled.
if h[3] and status ~= 'cancelled' then return {'cancel', ''} end
check_mark(mark)
local now = now_ms()
redis.call('HSET', run_key, 'status', status, 'doc', doc, 'updated_at', now)
if status == 'running' or status == 'resuming' then
  redis.call('HSET', run_key, 'lease_until', now + tonumber(lease_ms))
else
  redis.call('HSET', run_key, 'lease_owner', '', 'lease_until', 0)
end
local n = tonumber(ARGV[tail])
local p = tail + 1
if status == 'awaiting_approval' then
  redis.call('HSET', run_key, 'turn', turn, 'pending_count', n, 'decided_count', 0)
end
for _ = 1, n do
  local held
  held, p = read_held_terms(p)
  redis.call('HSET', calls_key, held.call_id, held.terms)
end
outbox_args(append_audits(p))
local ttl = tonumber(ttl_secs)
if ttl > 0 then
  -- The audit trail outlives the run.
  for i = 1, #KEYS do
    if KEYS[i] ~= audit_key then redis.call('EXPIRE', KEYS[i], ttl) end
  end
end
redis.call('HINCRBY', run_key, 'version', 1)
return reply('ok', '')
