-- Appends audit entries to an existing run's chain (a channel was told of a call).
-- ARGV (after the common three): the audit entries.
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing', ''} end
check_mark(ARGV[3])
append_audits(4)
return reply('ok', '')
