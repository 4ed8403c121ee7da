-- Escalates a held call: rewrites the run's document and the held call (more deciders, a later
-- deadline) if nothing changed since the caller read version ARGV[4] and the call is still
-- undecided, with the audit entry and the announcement.
-- ARGV (after the common three): 4 version, 5 call_id, 6 doc, 7 held call JSON, then the
-- audit entry and the announcement.
local h = redis.call('HMGET', KEYS[1], 'status', 'version', 'cancel')
if h[1] ~= 'awaiting_approval' or h[2] ~= ARGV[4] or h[3] then return {'moved', ''} end
if redis.call('HEXISTS', KEYS[3], ARGV[5]) == 1 then return {'moved', ''} end
check_mark(ARGV[3])
redis.call('HSET', KEYS[1], 'doc', ARGV[6])
redis.call('HSET', KEYS[2], ARGV[5], ARGV[7])
redis.call('HINCRBY', KEYS[1], 'version', 1)
outbox_args(append_audits(8))
return reply('ok', '')
