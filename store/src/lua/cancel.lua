-- Asks a run to stop: marks it, once, with who asked and why, audits that and queues the nudge
-- that makes a worker take it (a worker finishes it as cancelled at its next claim or save).
-- A paused run's held calls close in the same step: from here the decision script refuses
-- every decision on the run, and each held call of the current turn (decided or not: none of
-- them will run) gets its approval.cancelled in the outbox, so its channels say so.
-- ARGV (after the common three): 4 the cancellation JSON, 5 the approval.cancelled subject,
-- 6 the message id prefix of those (the call id completes it), then the audit entry and the
-- nudge.
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {'missing', ''} end
if st == 'completed' or st == 'failed' or st == 'cancelled' then return {'finished', st} end
if redis.call('HEXISTS', KEYS[1], 'cancel') == 1 then return {'requested', st} end
check_mark(ARGV[3])
redis.call('HSET', KEYS[1], 'cancel', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'version', 1)
outbox_args(append_audits(7))
if st == 'awaiting_approval' then
  local turn = redis.call('HGET', KEYS[1], 'turn')
  local by = cjson.encode(cjson.decode(ARGV[4]).by)
  local calls = redis.call('HGETALL', KEYS[2])
  for i = 1, #calls, 2 do
    local held = cjson.decode(calls[i + 1])
    if tostring(held.turn) == turn then
      local channels = ''
      if held.channels and #held.channels > 0 then
        channels = ',"channels":' .. cjson.encode(held.channels)
      end
      outbox(ARGV[6] .. calls[i], ARGV[5], '{"version":1,"type":"approval.cancelled","run_id":'
        .. cjson.encode(ARGV[1]) .. ',"call_id":' .. cjson.encode(calls[i])
        .. ',"cancelled_by":' .. by .. channels .. '}')
    end
  end
end
return reply('requested', st)
