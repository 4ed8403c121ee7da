-- Renews (lease_ms > 0) or releases (lease_ms = 0) the caller's lease.
local h = redis.call('HMGET', run_key, 'status', 'lease_owner')
if h[2] ~= owner or (h[1] ~= 'running' and h[1] ~= 'resuming') then return 0 end
local lease = tonumber(lease_ms)
if lease > 0 then
  redis.call('HSET', run_key, 'lease_until', now_ms() + lease)
else
  redis.call('HSET', run_key, 'lease_owner', '', 'lease_until', 0)
end
return 1
