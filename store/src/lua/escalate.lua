-- Escalates a held call: rewrites the run's document and the held call (more deciders, a later
-- deadline) if nothing changed since the caller read `version` and the call is still
-- undecided, with the audit entry and the announcement (the tail).
local h = redis.call('HMGET', run_key, 'status', 'version', 'cancel')
if h[1] ~= 'awaiting_approval' or h[2] ~= version or h[3] then return {'moved', ''} end
if redis.call('HEXISTS', decisions_key, call_id) == 1 then return {'moved', ''} end
marked()
redis.call('HSET', run_key, 'doc', doc)
redis.call('HSET', calls_key, call_id, terms)
redis.call('HINCRBY', run_key, 'version', 1)
outbox_args(append_audits(tail))
return reply('ok', '')
