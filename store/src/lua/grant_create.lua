-- Makes a standing grant, once: a second call for the same id (a retried approval) answers
-- the grant as it stands. Its clock is Redis's: it expires `expires_in_ms` from now, and is
-- kept `keep_ms` longer to be listed. Ended grants leave the lookup index as they are passed.
-- Replies {'created' | 'exists', def, uses, revoked}.
local h = redis.call('HMGET', grant_key, 'def', 'uses', 'revoked')
if h[1] then return {'exists', h[1], h[2], h[3] or ''} end
local now = now_ms()
local g = cjson.decode(def)
g.created_at = now
g.expires_at = now + tonumber(expires_in_ms)
local stored = cjson.encode(g)
local until_ms = g.expires_at + tonumber(keep_ms)
redis.call('HSET', grant_key, 'def', stored, 'uses', 0)
redis.call('PEXPIREAT', grant_key, until_ms)
redis.call('ZADD', grants_key, now, id)
redis.call('ZADD', for_key, g.expires_at, id)
redis.call('ZREMRANGEBYSCORE', for_key, '-inf', now)
-- Nothing kept is older than the longest grant plus its keeping.
redis.call('ZREMRANGEBYSCORE', grants_key, '-inf', now - 31 * 86400000 - tonumber(keep_ms))
return {'created', stored, '0', ''}
