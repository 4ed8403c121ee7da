-- Takes a resumed run out of the paused-runs index and its decided calls' timers (the
-- tail: their members) out of the deadlines and reminders, all one shard.
redis.call('ZREM', awaiting_key, run)
if #ARGV >= tail then
  local members = {unpack(ARGV, tail)}
  redis.call('ZREM', deadlines_key, unpack(members))
  redis.call('ZREM', reminders_key, unpack(members))
end
return 1
