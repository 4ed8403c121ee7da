-- Marks an approved call as started before its side effect runs, with the attempt's token.
-- Returns run (first time, or this very attempt asking again
-- because it lost the reply: it has not called the tool yet), started (another attempt started
-- it and never recorded a result) or done with the recorded result.
local v = redis.call('HGET', exec_key, call_id)
if not v then
  redis.call('HSET', exec_key, call_id, 'started:' .. token)
  return {'run', ''}
end
if v == 'started:' .. token then return {'run', ''} end
if string.sub(v, 1, 7) == 'started' then return {'started', ''} end
return {'done', v}
