-- Re-marks a run only if its mark is still `mark`: one sweeper takes it for a grace period.
-- Returns the new mark, or false.
if redis.call('ZSCORE', outbox_index_key, run) ~= mark then return false end
local now = now_ms()
if now <= tonumber(mark) then now = tonumber(mark) + 1 end
redis.call('ZADD', outbox_index_key, now, run)
return now
