-- Adds (or sets again) one call's share of a window, counted from now on Redis's clock, and
-- answers the total of the window's other shares: read and added in one step, so of two calls
-- at once the second reads the first's share. Shares older than the window are dropped
-- first. `entries_key` scores each share's member by when it was counted; `amounts_key` keeps
-- its amount. Both expire a window after the last share counted.
local now = now_ms()
local old = redis.call('ZRANGEBYSCORE', entries_key, '-inf', '(' .. (now - tonumber(over_ms)))
if #old > 0 then
  in_chunks('ZREM', entries_key, old)
  in_chunks('HDEL', amounts_key, old)
end
local total = 0
local amounts = redis.call('HGETALL', amounts_key)
for i = 1, #amounts, 2 do
  if amounts[i] ~= member then total = total + tonumber(amounts[i + 1]) end
end
redis.call('ZADD', entries_key, now, member)
redis.call('HSET', amounts_key, member, amount)
redis.call('PEXPIRE', entries_key, over_ms)
redis.call('PEXPIRE', amounts_key, over_ms)
return string.format('%.17g', total)
