-- Creates a queued run unless it exists. KEYS: run. ARGV: doc, requested_by.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'status', 'queued', 'version', 1, 'turn', 0,
  'pending_count', 0, 'decided_count', 0, 'lease_owner', '', 'lease_until', 0,
  'requested_by', ARGV[2], 'doc', ARGV[1], 'updated_at', now_ms())
return 1
