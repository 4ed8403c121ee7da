-- Writes the run document and its new status, if the caller still holds the lease.
-- KEYS: run, calls, decisions, exec, votes, refs.
-- ARGV: owner, now_ms, lease_ms, status, doc, ttl_secs, turn, pending_count,
--       then call_id, "turn:digest" pairs of the calls a pause holds for a person.
local h = redis.call('HMGET', KEYS[1], 'status', 'lease_owner')
if h[2] ~= ARGV[1] or (h[1] ~= 'running' and h[1] ~= 'resuming') then
  return {'lost', h[1] or ''}
end
local st = ARGV[4]
local now = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'status', st, 'doc', ARGV[5], 'updated_at', now)
if st == 'running' or st == 'resuming' then
  redis.call('HSET', KEYS[1], 'lease_until', now + tonumber(ARGV[3]))
else
  redis.call('HSET', KEYS[1], 'lease_owner', '', 'lease_until', 0)
end
if st == 'awaiting_approval' then
  redis.call('HSET', KEYS[1], 'turn', ARGV[7], 'pending_count', ARGV[8], 'decided_count', 0)
  for i = 9, #ARGV, 2 do
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  end
end
local ttl = tonumber(ARGV[6])
if ttl > 0 then
  for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
end
return {'ok', tostring(redis.call('HINCRBY', KEYS[1], 'version', 1))}
