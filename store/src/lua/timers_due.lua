-- Takes or renews the shard's sweep lease for `sweeper`, and if it holds it, returns the
-- members of the reminders and of the deadlines due by Redis's clock, at most `limit` of
-- each; false while another sweeper holds the lease. Every worker runs it for every shard
-- several times a second, so it has no prelude but the clock.
local holder = redis.call('GET', lease_key)
if holder and holder ~= sweeper then return false end
redis.call('SET', lease_key, sweeper, 'PX', tonumber(lease_ms))
local now = now_ms()
local function due(key)
  return redis.call('ZRANGE', key, '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(limit))
end
return {due(reminders_key), due(deadlines_key)}
