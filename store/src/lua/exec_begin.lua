-- Marks an approved call as started before its side effect runs, with the attempt's token.
-- KEYS: exec. ARGV: call_id, token. Returns run (first time, or this very attempt asking again
-- because it lost the reply: it has not called the tool yet), started (another attempt started
-- it and never recorded a result) or done with the recorded result.
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then
  redis.call('HSET', KEYS[1], ARGV[1], 'started:' .. ARGV[2])
  return {'run', ''}
end
if v == 'started:' .. ARGV[2] then return {'run', ''} end
if string.sub(v, 1, 7) == 'started' then return {'started', ''} end
return {'done', v}
