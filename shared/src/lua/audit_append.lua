-- Appends a chained audit element if the list's last hash is still ARGV[1].
-- KEYS: list. ARGV: prev_hash, element_json. Returns {1} or {0, current_head}.
local last = redis.call('LINDEX', KEYS[1], -1)
local head = ''
if last then head = cjson.decode(last)['hash'] end
if head ~= ARGV[1] then return {0, head} end
redis.call('RPUSH', KEYS[1], ARGV[2])
return {1, ''}
