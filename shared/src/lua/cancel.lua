-- Asks a run to stop: marks it, once, with who asked and why, audits that and queues the nudge
-- that makes a worker take it (a worker finishes it as cancelled at its next claim or save).
-- ARGV (after the common three): 4 the cancellation JSON, then the audit entry and the nudge.
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {'missing', ''} end
if st == 'completed' or st == 'failed' or st == 'cancelled' then return {'finished', st} end
if redis.call('HEXISTS', KEYS[1], 'cancel') == 1 then return {'requested', st} end
check_mark(ARGV[3])
redis.call('HSET', KEYS[1], 'cancel', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'version', 1)
outbox_args(append_audits(5))
return reply('requested', st)
