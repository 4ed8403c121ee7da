-- Takes a resumed run out of the paused-runs index and its decided calls' timers (the
-- tail: their members) out of the deadlines and reminders, all one shard.
redis.call('ZREM', awaiting_key, run)
in_chunks('ZREM', deadlines_key, ARGV, tail)
in_chunks('ZREM', reminders_key, ARGV, tail)
return 1
