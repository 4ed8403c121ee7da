-- Marks a call as started before its side effect runs, with the attempt's token, if the caller
-- still holds the run's lease and nobody asked to cancel the run: so no call starts after a
-- cancel was accepted, and a worker that lost the run starts nothing.
-- Returns run (first time, or this very attempt asking again because it lost the reply: it has
-- not called the tool yet), started (another attempt started it and never recorded a result),
-- done with the recorded result, cancelled, or lost with the run's status.
local h = redis.call('HMGET', run_key, 'status', 'lease_owner', 'cancel')
if h[3] then return {'cancelled', ''} end
if h[2] ~= owner or (h[1] ~= 'running' and h[1] ~= 'resuming') then
  return {'lost', h[1] or ''}
end
local v = redis.call('HGET', exec_key, call_id)
if not v then
  redis.call('HSET', exec_key, call_id, 'started:' .. token)
  return {'run', ''}
end
if v == 'started:' .. token then return {'run', ''} end
if string.sub(v, 1, 7) == 'started' then return {'started', ''} end
return {'done', v}
