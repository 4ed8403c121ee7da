-- Gives back one call's share of a window: the call did not run.
redis.call('ZREM', entries_key, member)
return redis.call('HDEL', amounts_key, member)
