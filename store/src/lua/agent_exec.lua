-- The execution record of a call released to the external agent that asked for it, which runs
-- it itself and says so: first `started`, by one attempt, before the side effect; then that
-- attempt's end. The gateway has checked that the call was released; this keeps the order,
-- atomically with the trail: one attempt starts a call, and only it ends it, so a call asked
-- again (the same idempotency key, another process) is never run twice silently.
-- `start_field` and `end_field` are the fields of `exec_key` the claim and the end are kept
-- in; `phase` is 'started' or 'ended', `record` the JSON written (an ExecStart or an ExecEnd,
-- kept as given). Tail: the audit entry, appended only when something is written.
-- Replies ok, repeat (this attempt's write asked again, after a lost answer: the record
-- kept), taken (another attempt's: its start), not_started, or missing.
if redis.call('EXISTS', run_key) == 0 then return {'missing', ''} end
local started = redis.call('HGET', exec_key, start_field)
local ours = started and cjson.decode(started).attempt == attempt
if not started and phase == 'ended' then return {'not_started', ''} end
if started and not ours then return {'taken', started} end
local field = phase == 'started' and start_field or end_field
local kept = redis.call('HGET', exec_key, field)
if kept then return {'repeat', kept} end
marked()
redis.call('HSET', exec_key, field, record)
append_audits(tail)
-- A finished run's keys expire with it; the record joins them if it was written after.
local ttl = redis.call('PTTL', run_key)
if ttl > 0 then redis.call('PEXPIRE', exec_key, ttl) end
return reply('ok', record)
