-- Makes a delegation, on Redis's clock: it starts now and ends `lasts_ms` from now; it is
-- kept `keep_ms` longer to be listed. Replies the delegation as stored.
local now = now_ms()
local d = cjson.decode(def)
d.created_at = now
d.ends_at = now + tonumber(lasts_ms)
local stored = cjson.encode(d)
redis.call('HSET', delegation_key, 'def', stored)
redis.call('PEXPIREAT', delegation_key, d.ends_at + tonumber(keep_ms))
redis.call('ZADD', delegations_key, now, id)
-- Nothing kept is older than the longest delegation plus its keeping.
redis.call('ZREMRANGEBYSCORE', delegations_key, '-inf', now - 91 * 86400000 - tonumber(keep_ms))
return stored
