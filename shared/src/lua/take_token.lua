-- Takes a single-use token: returns its value and remaining milliseconds, and deletes it.
-- KEYS: token. Returns {} when there is none.
local v = redis.call('GET', KEYS[1])
if not v then return {} end
local ttl = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1])
return {v, tostring(ttl)}
