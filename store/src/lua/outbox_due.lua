-- Marks older than `grace_ms`, at most `limit`, as a flat run, score list.
return redis.call('ZRANGE', outbox_index_key, '-inf', now_ms() - tonumber(grace_ms),
  'BYSCORE', 'LIMIT', 0, tonumber(limit), 'WITHSCORES')
