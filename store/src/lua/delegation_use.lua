-- Takes a use of a delegation for one decision, if it still stands: not ended, not past its
-- end on Redis's clock. The use is recorded under its call, so asking again for the same call
-- answers 'again'. Serialized with ending it on the delegations' slot, so no use is taken
-- after an end has answered. Replies ok, again, ended, expired or gone.
local h = redis.call('HMGET', delegation_key, 'def', 'ended')
if not h[1] then return 'gone' end
if redis.call('HEXISTS', uses_key, use_key) == 1 then return 'again' end
if h[2] then return 'ended' end
local d = cjson.decode(h[1])
local now = now_ms()
if now >= d.ends_at then return 'expired' end
local u = cjson.decode(use_json)
u.at = now
redis.call('HSET', uses_key, use_key, cjson.encode(u))
redis.call('PEXPIREAT', uses_key, now + redis.call('PTTL', delegation_key))
return 'ok'
