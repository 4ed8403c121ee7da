-- Asks a run to stop: marks it, once, with who asked and why, audits that and queues the nudge
-- that makes a worker take it (a worker finishes it as cancelled at its next claim or save).
-- A paused run's held calls close in the same step: from here the decision script refuses
-- every decision on the run, and each held call of the current turn (decided or not: none of
-- them will run) gets its approval.cancelled in the outbox, so its channels say so.
-- Tail: the audit entry and the nudge.
local st = redis.call('HGET', run_key, 'status')
if not st then return {'missing', ''} end
if st == 'completed' or st == 'failed' or st == 'cancelled' then return {'finished', st} end
if redis.call('HEXISTS', run_key, 'cancel') == 1 then return {'requested', st} end
marked()
redis.call('HSET', run_key, 'cancel', cancellation)
redis.call('HINCRBY', run_key, 'version', 1)
outbox_args(append_audits(tail))
if st == 'awaiting_approval' then
  local turn = redis.call('HGET', run_key, 'turn')
  local calls = redis.call('HGETALL', calls_key)
  for i = 1, #calls, 2 do
    local held = cjson.decode(calls[i + 1])
    if tostring(held.turn) == turn then
      local channels = nil
      if held.channels and #held.channels > 0 then channels = held.channels end
      outbox(cancelled_id_prefix .. calls[i], cancelled_subject,
        event(cancelled_event, {call_id = calls[i], channels = channels}))
    end
  end
end
return reply('requested', st)
