-- Creates a queued run unless it exists. KEYS: run. ARGV: doc, now.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'status', 'queued', 'version', 1, 'turn', 0,
  'pending_count', 0, 'decided_count', 0, 'lease_owner', '', 'lease_until', 0,
  'doc', ARGV[1], 'updated_at', ARGV[2])
return 1
