-- Drops a run's mark if it is still `mark`.
if redis.call('ZSCORE', outbox_index_key, run) ~= mark then return 0 end
return redis.call('ZREM', outbox_index_key, run)
