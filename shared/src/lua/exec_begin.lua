-- Marks an approved call as started before its side effect runs.
-- KEYS: exec. ARGV: call_id. Returns run (first time), started (a crash interrupted an
-- earlier attempt) or done with the recorded result.
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then
  redis.call('HSET', KEYS[1], ARGV[1], 'started')
  return {'run', ''}
end
if v == 'started' then return {'started', ''} end
return {'done', v}
