-- A run's entries in its shard's indexes, which live in the shard's Cluster slot, not the
-- run's: its outbox mark (scored with Redis's time, later than any earlier mark, and
-- returned), then what `index` (JSON, or '') changes: the held calls' timers it takes off
-- (`unlist`) and puts on (`deadlines`, `reminders`: [score, member] pairs), and whether the
-- run is listed as paused (`awaiting`: true, false, or absent to leave it).
local function shard_step(outbox_index, awaiting, deadlines, reminders, run, index)
  local now = now_ms()
  local old = tonumber(redis.call('ZSCORE', outbox_index, run))
  if old and old >= now then now = old + 1 end
  redis.call('ZADD', outbox_index, now, run)
  if index == '' then return now end
  local ix = cjson.decode(index)
  if ix.unlist then
    in_chunks('ZREM', deadlines, ix.unlist)
    in_chunks('ZREM', reminders, ix.unlist)
  end
  for key, timers in pairs({[deadlines] = ix.deadlines or {}, [reminders] = ix.reminders or {}}) do
    local flat = {}
    for _, t in ipairs(timers) do
      table.insert(flat, t[1]); table.insert(flat, t[2])
    end
    in_chunks('ZADD', key, flat)
  end
  if ix.awaiting == true then
    redis.call('ZADD', awaiting, now, run)
  elseif ix.awaiting == false then
    redis.call('ZREM', awaiting, run)
  end
  return now
end
