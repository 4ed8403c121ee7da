-- Appends audit entries to an existing run's chain (a channel was told of a call).
-- Tail: the audit entries.
if redis.call('EXISTS', run_key) == 0 then return {'missing', ''} end
marked()
append_audits(tail)
return reply('ok', '')
