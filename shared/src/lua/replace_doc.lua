-- Rewrites a paused run's document (an escalation widens a held call's approvers and moves
-- its deadline) if nothing changed since it was read and the call is still undecided.
-- KEYS: run, decisions. ARGV: version read, call_id, doc.
local h = redis.call('HMGET', KEYS[1], 'status', 'version')
if h[1] ~= 'awaiting_approval' or h[2] ~= ARGV[1] then return 0 end
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'doc', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'version', 1)
return 1
