-- `cmd key values[from..]`, a thousand values at a time: Lua's `unpack` gives at most a few
-- thousand, and a turn may hold more calls than that. A thousand is even, so an HSET's
-- fields stay with their values.
local function in_chunks(cmd, key, values, from)
  local i = from or 1
  while i <= #values do
    local last = math.min(i + 999, #values)
    redis.call(cmd, key, unpack(values, i, last))
    i = last + 1
  end
end
