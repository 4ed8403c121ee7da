-- Counts one use of a grant for one held call, if the grant still stands: not revoked, not
-- expired on Redis's clock, uses left. The use is recorded under its call, so asking again
-- for the same call (a redelivered request) answers 'again' and counts nothing twice, even
-- after a revocation: that use was taken before it. Serialized with revocations on the
-- grants' slot, so no use is counted after a revocation has answered.
-- Replies {outcome, uses}: ok, again, revoked, expired, used_up or gone.
local h = redis.call('HMGET', grant_key, 'def', 'uses', 'revoked')
if not h[1] then return {'gone', '0'} end
if redis.call('HEXISTS', uses_key, use_key) == 1 then return {'again', h[2]} end
if h[3] then return {'revoked', h[2]} end
local g = cjson.decode(h[1])
local now = now_ms()
if now >= g.expires_at then return {'expired', h[2]} end
if tonumber(h[2]) >= g.max_uses then return {'used_up', h[2]} end
local uses = redis.call('HINCRBY', grant_key, 'uses', 1)
local u = cjson.decode(use_json)
u.at = now
redis.call('HSET', uses_key, use_key, cjson.encode(u))
redis.call('PEXPIREAT', uses_key, now + redis.call('PTTL', grant_key))
return {'ok', tostring(uses)}
