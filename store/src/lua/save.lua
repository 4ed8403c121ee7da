-- Writes the run document and its new status, if the caller still holds the lease and nobody
-- cancelled the run (then only `cancelled` may be written), with the audit entries of what
-- changed and the announcements of it. A turn stored before its calls run marks the calls in
-- `starts` started by the attempt `start_token` in the same step (see exec_begin.lua), so no
-- call starts on a cancelled run, and every call started is of a stored turn.
-- Tail: the terms of each call a pause holds for a person (`held`, then that many
-- `read_held_terms`), then the audit entries and the announcements.
local h = redis.call('HMGET', run_key, 'status', 'lease_owner', 'cancel', 'version')
if h[2] ~= owner or (h[1] ~= 'running' and h[1] ~= 'resuming') then
  return {'lost', h[1] or ''}
end
-- A run someone cancelled goes nowhere but to cancelled.
if h[3] and status ~= 'cancelled' then return {'cancel', ''} end
marked()
if start_token ~= '' then
  for call_id in string.gmatch(starts, '%S+') do
    redis.call('HSET', exec_key, call_id, 'started:' .. start_token)
  end
end
local now = now_ms()
local n = tonumber(ARGV[tail])
local fields = {'status', status, 'doc', doc, 'updated_at', now, 'version', tonumber(h[4]) + 1}
if status == 'running' or status == 'resuming' then
  table.insert(fields, 'lease_until'); table.insert(fields, now + tonumber(lease_ms))
else
  for _, f in ipairs({'lease_owner', '', 'lease_until', 0}) do table.insert(fields, f) end
end
if status == 'awaiting_approval' then
  for _, f in ipairs({'turn', turn, 'pending_count', n, 'decided_count', 0}) do
    table.insert(fields, f)
  end
end
local p = tail + 1
local terms = {}
for _ = 1, n do
  local held
  held, p = read_held_terms(p)
  table.insert(terms, held.call_id)
  table.insert(terms, held.terms)
end
in_chunks('HSET', calls_key, terms)
outbox_args(append_audits(p))
-- Written before the expiries, so the keys they create get theirs.
flush(fields)
local ttl = tonumber(ttl_secs)
if ttl > 0 then
  -- The audit trail too: its elements are in the outbox with this save, and the AUDIT stream
  -- keeps them far longer (the long-term record).
  -- The run's keys alone: the shard's indexes it was given are shared by every run.
  for _, key in ipairs(run_keys) do redis.call('EXPIRE', key, ttl) end
end
return reply('ok', '')
