-- Ends a delegation early: from this step on no use is taken (see delegation_use.lua). Ending
-- it again changes nothing. Replies {'ended' | 'already' | 'missing', def, ended}.
local h = redis.call('HMGET', delegation_key, 'def', 'ended')
if not h[1] then return {'missing', '', ''} end
if h[2] then return {'already', h[1], h[2]} end
local e = cjson.decode(ending)
e.at = now_ms()
local stored = cjson.encode(e)
redis.call('HSET', delegation_key, 'ended', stored)
return {'ended', h[1], stored}
