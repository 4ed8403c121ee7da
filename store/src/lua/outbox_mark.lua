-- Scores a run in the outbox index with Redis's time, later than any earlier mark, and
-- returns that mark. With `awaiting_key` (a pause's one step before its save), the run is
-- also listed in the paused-runs index at that time, in the same shard.
local now = now_ms()
local old = tonumber(redis.call('ZSCORE', outbox_index_key, run))
if old and old >= now then now = old + 1 end
redis.call('ZADD', outbox_index_key, now, run)
if awaiting_key then redis.call('ZADD', awaiting_key, now, run) end
return now
