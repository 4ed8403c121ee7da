-- Revokes a grant: from this step on no use is counted (see grant_use.lua). Revoking it again
-- changes nothing. Replies {'revoked' | 'already' | 'missing', def, uses, revoked, spent}.
local h = redis.call('HMGET', grant_key, 'def', 'uses', 'revoked', 'spent')
if not h[1] then return {'missing', '', '0', '', '0'} end
if h[3] then return {'already', h[1], h[2], h[3], h[4] or '0'} end
local r = cjson.decode(revocation)
r.at = now_ms()
local stored = cjson.encode(r)
redis.call('HSET', grant_key, 'revoked', stored)
return {'revoked', h[1], h[2], stored, h[4] or '0'}
