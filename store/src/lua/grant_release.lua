-- Gives back the use a call took when its decision was then refused (someone decided it
-- first, or the run stopped waiting): a use, and what it added to the grant's total, is kept
-- only by a recorded decision.
local used = redis.call('HGET', uses_key, use_key)
if not used then return 0 end
redis.call('HDEL', uses_key, use_key)
redis.call('HINCRBY', grant_key, 'uses', -1)
local amount = cjson.decode(used).amount
if amount and amount > 0 then redis.call('HINCRBYFLOAT', grant_key, 'spent', -amount) end
return 1
