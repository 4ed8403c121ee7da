-- Counts one use of a grant for one held call, if the grant still stands: not revoked, not
-- expired on Redis's clock, uses left, and, with a total, room in it for the use's amount
-- (`spent` counts what the uses added up to). The use is recorded under its call, so asking
-- again for the same call (a redelivered request) answers 'again' and counts nothing twice,
-- even after a revocation: that use was taken before it. Serialized with revocations on the
-- grants' slot, so no use is counted after a revocation has answered, and two uses at once
-- cannot both fit in the room left for one.
-- Replies {outcome, uses}: ok, again, revoked, expired, used_up, over_total or gone.
local h = redis.call('HMGET', grant_key, 'def', 'uses', 'revoked', 'spent')
if not h[1] then return {'gone', '0'} end
if redis.call('HEXISTS', uses_key, use_key) == 1 then return {'again', h[2]} end
if h[3] then return {'revoked', h[2]} end
local g = cjson.decode(h[1])
local now = now_ms()
if now >= g.expires_at then return {'expired', h[2]} end
if tonumber(h[2]) >= g.max_uses then return {'used_up', h[2]} end
local u = cjson.decode(use_json)
if g.total then
  -- A millionth of slack: amounts are decimal, their sum binary.
  if tonumber(h[4] or '0') + u.amount > g.total.max + 1e-6 then return {'over_total', h[2]} end
  redis.call('HINCRBYFLOAT', grant_key, 'spent', u.amount)
end
local uses = redis.call('HINCRBY', grant_key, 'uses', 1)
u.at = now
redis.call('HSET', uses_key, use_key, cjson.encode(u))
redis.call('PEXPIREAT', uses_key, now + redis.call('PTTL', grant_key))
return {'ok', tostring(uses)}
