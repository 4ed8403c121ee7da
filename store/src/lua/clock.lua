-- Redis's clock, the one every lease and deadline is compared with. Read once per script: to
-- every other client a script happens in one instant.
local clock_ms = nil
local function now_ms()
  if not clock_ms then
    local t = redis.call('TIME')
    clock_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return clock_ms
end
