-- Renews (lease_ms > 0) or releases (lease_ms = 0) the caller's lease.
-- KEYS: run. ARGV: owner, lease_ms.
local h = redis.call('HMGET', KEYS[1], 'status', 'lease_owner')
if h[2] ~= ARGV[1] or (h[1] ~= 'running' and h[1] ~= 'resuming') then return 0 end
local lease = tonumber(ARGV[2])
if lease > 0 then
  redis.call('HSET', KEYS[1], 'lease_until', now_ms() + lease)
else
  redis.call('HSET', KEYS[1], 'lease_owner', '', 'lease_until', 0)
end
return 1
