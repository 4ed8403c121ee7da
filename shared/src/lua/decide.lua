-- Records a decision on one held call; the first decision per call wins.
-- KEYS: run, calls, decisions. ARGV: call_id, digest, decision_json, fingerprint.
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {'no_run', ''} end
local existing = redis.call('HGET', KEYS[3], ARGV[1])
if existing then
  if cjson.decode(existing)['fingerprint'] == ARGV[4] then return {'duplicate', existing} end
  return {'conflict', existing}
end
if st ~= 'awaiting_approval' then return {'not_waiting', st} end
local held = redis.call('HGET', KEYS[2], ARGV[1])
if not held then return {'no_call', ''} end
local sep = string.find(held, ':', 1, true)
if string.sub(held, 1, sep - 1) ~= redis.call('HGET', KEYS[1], 'turn') then
  return {'no_call', ''}
end
local digest = string.sub(held, sep + 1)
if digest ~= ARGV[2] then return {'stale_digest', digest} end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('HINCRBY', KEYS[1], 'version', 1)
local decided = redis.call('HINCRBY', KEYS[1], 'decided_count', 1)
if decided >= tonumber(redis.call('HGET', KEYS[1], 'pending_count')) then
  return {'recorded', '1'}
end
return {'recorded', '0'}
