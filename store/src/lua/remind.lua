-- Reminds once about a call still held, undecided, in the run's current turn: the audit entry
-- and the announcement. ARGV (after the common three): 4 call_id, then the audit entry and
-- the announcement.
local h = redis.call('HMGET', KEYS[1], 'status', 'cancel')
if h[1] ~= 'awaiting_approval' or h[2] then return {'moved', ''} end
if redis.call('HEXISTS', KEYS[3], ARGV[4]) == 1 then return {'moved', ''} end
local raw = redis.call('HGET', KEYS[2], ARGV[4])
if not raw or tostring(cjson.decode(raw).turn) ~= redis.call('HGET', KEYS[1], 'turn') then
  return {'moved', ''}
end
if redis.call('HEXISTS', KEYS[5], ARGV[4] .. '|reminded') == 1 then return {'moved', ''} end
check_mark(ARGV[3])
redis.call('HSET', KEYS[5], ARGV[4] .. '|reminded', '1')
outbox_args(append_audits(5))
return reply('ok', '')
