-- Records a decision on one held call; the first decision per call wins. A call that needs
-- several approvals collects them one per principal until the quorum is met; any rejection
-- decides at once.
-- KEYS: run, calls, decisions, votes.
-- ARGV: call_id, digest, decision_json, fingerprint, principal, quorum, action.
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
local decision = ARGV[3]
local quorum = tonumber(ARGV[6])
if quorum > 1 and ARGV[7] == 'approve' then
  local vote = ARGV[1] .. '|' .. ARGV[5]
  local earlier = redis.call('HGET', KEYS[4], vote)
  if earlier then return {'duplicate_vote', earlier} end
  redis.call('HSET', KEYS[4], vote, decision)
  local approvals = redis.call('HINCRBY', KEYS[4], ARGV[1] .. '#', 1)
  redis.call('HINCRBY', KEYS[1], 'version', 1)
  if approvals < quorum then return {'vote', tostring(approvals)} end
  -- The quorum is met: the decision names everyone who approved.
  local names = {}
  local fields = redis.call('HGETALL', KEYS[4])
  local prefix = ARGV[1] .. '|'
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, #prefix) == prefix then
      table.insert(names, string.sub(fields[i], #prefix + 1))
    end
  end
  table.sort(names)
  local d = cjson.decode(decision)
  d['decided_by'] = table.concat(names, ', ')
  decision = cjson.encode(d)
end
redis.call('HSET', KEYS[3], ARGV[1], decision)
redis.call('HINCRBY', KEYS[1], 'version', 1)
local decided = redis.call('HINCRBY', KEYS[1], 'decided_count', 1)
if decided >= tonumber(redis.call('HGET', KEYS[1], 'pending_count')) then
  return {'recorded', '1'}
end
return {'recorded', '0'}
