-- Creates a queued run unless it exists.
if redis.call('EXISTS', run_key) == 1 then return 0 end
redis.call('HSET', run_key, 'status', 'queued', 'version', 1, 'turn', 0,
  'pending_count', 0, 'decided_count', 0, 'lease_owner', '', 'lease_until', 0,
  'requested_by', requested_by, 'agent', agent, 'doc', doc, 'updated_at', now_ms())
return 1
