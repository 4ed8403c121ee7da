-- Reminds once about a call still held, undecided, in the run's current turn: the audit entry
-- and the announcement (the tail).
local h = redis.call('HMGET', run_key, 'status', 'cancel')
if h[1] ~= 'awaiting_approval' or h[2] then return {'moved', ''} end
if redis.call('HEXISTS', decisions_key, call_id) == 1 then return {'moved', ''} end
local raw = redis.call('HGET', calls_key, call_id)
if not raw or tostring(cjson.decode(raw).turn) ~= redis.call('HGET', run_key, 'turn') then
  return {'moved', ''}
end
if redis.call('HEXISTS', refs_key, call_id .. '|reminded') == 1 then return {'moved', ''} end
marked()
redis.call('HSET', refs_key, call_id .. '|reminded', '1')
outbox_args(append_audits(tail))
return reply('ok', '')
