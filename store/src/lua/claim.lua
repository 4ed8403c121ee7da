-- Claims a run for one worker, with a lease.
-- queued -> running; awaiting_approval with every call decided (or the run cancelled) ->
-- resuming; running/resuming whose lease has lapsed -> taken over. Anything else is refused.
-- A claim that succeeds answers with what the worker reads next: the run's document,
-- cancellation and audit head, and, when it resumes, the decisions, so driving it starts
-- without a read.
local h = redis.call('HMGET', run_key, 'status', 'lease_until', 'pending_count', 'decided_count',
  'cancel', 'version', 'doc', 'audit_head')
local st = h[1]
if not st then return {'missing', '', '0'} end
local now = now_ms()
local nextst
if st == 'queued' then
  nextst = 'running'
elseif st == 'awaiting_approval' then
  if tonumber(h[4]) < tonumber(h[3]) and not h[5] then return {'waiting', st, '0'} end
  nextst = 'resuming'
elseif st == 'running' or st == 'resuming' then
  local lease_until = tonumber(h[2])
  if lease_until > now then return {'busy', st, tostring(lease_until - now)} end
  nextst = st
else
  return {'finished', st, '0'}
end
local v = tonumber(h[6]) + 1
redis.call('HSET', run_key, 'status', nextst, 'lease_owner', owner,
  'lease_until', now + tonumber(lease_ms), 'version', v)
local reply = {'claimed', nextst, tostring(v), h[7] or '', h[5] or '', h[8] or ''}
if nextst == 'resuming' then
  for _, field in ipairs(redis.call('HGETALL', decisions_key)) do table.insert(reply, field) end
end
return reply
