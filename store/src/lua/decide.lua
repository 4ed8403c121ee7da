-- Decides held calls: the one place where a decision becomes true. Every check is made here,
-- against the held calls as the pause stored them (turn, digest, who may decide, quorum,
-- self-approval, deadline) and the run's requester, in the same atomic step that records the
-- decisions, appends their audit entries and queues their announcements in the outbox. All
-- decisions of one request are checked before any is recorded; a refusal changes nothing but
-- the run's capped list of refusals.
-- ARGV (after the common three): 4 principal, 5 channel, 6 expiry ('1': the deadline decides),
-- 7 approval.decided subject, 8 approval.expired subject, 9 the email link's grant (with KEYS[10]
-- the link, spent with the decision), 10 '1' if the principal's role decides (see
-- `authority.rs`: the gateway's configuration knows roles, this script the held calls), 11 n,
-- then per decision: call_id, digest, action,
-- decision JSON, fingerprint, the digest its edit was checked against (or ''), audit entry, sha,
-- the head its link was computed from and that link (see `append_audit`), and the message
-- ids of its approval.decided and approval.expired.
-- Replies {'ok', results JSON, outbox...}, {'refused', refusal JSON}, or {'missing', ''}.
local principal, channel, expiry = ARGV[4], ARGV[5], ARGV[6] == '1'
local run = redis.call('HMGET', KEYS[1], 'status', 'cancel')
local status = run[1]
if not status then return {'missing', ''} end

local function refuse(d, code, detail)
  local why = {call_id = d.call_id, code = code, detail = detail or ''}
  if not expiry then
    why.at = now_ms()
    why.actor = principal
    why.channel = channel
    why.action = d.action
    redis.call('LPUSH', KEYS[9], cjson.encode(why))
    redis.call('LTRIM', KEYS[9], 0, 99)
    local ttl = redis.call('PTTL', KEYS[1])
    if ttl > 0 then redis.call('PEXPIRE', KEYS[9], ttl) end
  end
  return {'refused', cjson.encode(why)}
end

local decisions = {}
local n = tonumber(ARGV[11])
for i = 1, n do
  local p = 12 + 12 * (i - 1)
  decisions[i] = {call_id = ARGV[p], digest = ARGV[p + 1], action = ARGV[p + 2],
    json = ARGV[p + 3], fingerprint = ARGV[p + 4], checked = ARGV[p + 5],
    entry = ARGV[p + 6], sha = ARGV[p + 7], prev_guess = ARGV[p + 8], link = ARGV[p + 9],
    decided_id = ARGV[p + 10], expired_id = ARGV[p + 11]}
end

-- First every decision is checked: nothing is decided on a run someone asked to cancel, and
-- nothing by a principal whose role does not decide.
if run[2] or status == 'cancelled' then return refuse(decisions[1], 'run_cancelled', status) end
if not expiry and ARGV[10] ~= '1' then return refuse(decisions[1], 'role_may_not_decide') end
local now = now_ms()
local turn = redis.call('HGET', KEYS[1], 'turn')
local requester = redis.call('HGET', KEYS[1], 'requested_by')
for _, d in ipairs(decisions) do
  local existing = redis.call('HGET', KEYS[3], d.call_id)
  if existing then
    local e = cjson.decode(existing)
    if expiry then return {'settled', existing} end
    -- A repeat is answered only to the one who decided, about what they were shown.
    local same = e.fingerprint == d.fingerprint and e.digest == d.digest and not e.expired
      and (e.decided_by == principal
        or redis.call('HEXISTS', KEYS[4], d.call_id .. '|' .. principal) == 1)
    if not same then return refuse(d, 'decided', existing) end
    d.result = 'already_recorded'
  else
    if status ~= 'awaiting_approval' then return refuse(d, 'not_waiting', status) end
    local raw = redis.call('HGET', KEYS[2], d.call_id)
    if not raw then return refuse(d, 'no_call') end
    local held = cjson.decode(raw)
    if tostring(held.turn) ~= turn then return refuse(d, 'no_call') end
    if held.digest ~= d.digest then return refuse(d, 'stale_digest', held.digest) end
    d.held = held
    if expiry then
      if not held.deadline or now < held.deadline then return {'not_due', ''} end
    else
      if held.deadline and now >= held.deadline and not held.escalates then
        return refuse(d, 'past_deadline', tostring(held.deadline))
      end
      if held.deciders then
        local listed = false
        for _, p in ipairs(held.deciders) do
          if p == principal then listed = true end
        end
        if not listed then return refuse(d, 'not_approver', cjson.encode(held.deciders)) end
      end
      if d.action ~= 'reject' and not held.self_ok and requester == principal then
        return refuse(d, 'own_request')
      end
      if d.action == 'edit' then
        if held.quorum > 1 then return refuse(d, 'edit_with_quorum', tostring(held.quorum)) end
        if d.checked ~= d.digest then return refuse(d, 'edit_unchecked') end
      end
      if held.quorum > 1 and d.action == 'approve'
        and redis.call('HEXISTS', KEYS[4], d.call_id .. '|' .. principal) == 1 then
        d.result = 'already_voted'
      end
    end
  end
end
if #KEYS >= 10 and redis.call('GET', KEYS[10]) ~= ARGV[9] then
  return refuse(decisions[1], 'link_used')
end

-- Then all are recorded, audited and announced.
check_mark(ARGV[3])
-- A spent link keeps its grant, marked, until it expires: its page can still say what it
-- was for and how that ended, and it decides nothing again.
if #KEYS >= 10 then redis.call('SET', KEYS[10], 'spent:' .. ARGV[9], 'KEEPTTL') end
local results = {}
for _, d in ipairs(decisions) do
  local out = {call_id = d.call_id, status = d.result}
  if not d.result then
    local held = d.held
    local decision = d.json
    append_audit(d.entry, d.sha, d.prev_guess, d.link)
    redis.call('HINCRBY', KEYS[1], 'version', 1)
    local final = true
    if held.quorum > 1 and d.action == 'approve' then
      redis.call('HSET', KEYS[4], d.call_id .. '|' .. principal, decision)
      local approvals = redis.call('HINCRBY', KEYS[4], d.call_id .. '#', 1)
      out.approvals = approvals
      out.quorum = held.quorum
      if approvals < held.quorum then
        final = false
        out.status = 'approval_recorded'
      else
        -- The quorum is met: the decision names everyone who approved.
        local names = {}
        local fields = redis.call('HGETALL', KEYS[4])
        local prefix = d.call_id .. '|'
        for i = 1, #fields, 2 do
          if string.sub(fields[i], 1, #prefix) == prefix then
            table.insert(names, string.sub(fields[i], #prefix + 1))
          end
        end
        table.sort(names)
        local merged = cjson.decode(decision)
        merged.decided_by = table.concat(names, ', ')
        decision = cjson.encode(merged)
      end
    end
    if final then
      redis.call('HSET', KEYS[3], d.call_id, decision)
      local decided = redis.call('HINCRBY', KEYS[1], 'decided_count', 1)
      local all = decided >= tonumber(redis.call('HGET', KEYS[1], 'pending_count'))
      out.status = 'recorded'
      out.all_decided = all
      local channels = ''
      if held.channels and #held.channels > 0 then
        channels = ',"channels":' .. cjson.encode(held.channels)
      end
      if expiry then
        outbox(d.expired_id, ARGV[8], '{"version":1,"type":"approval.expired","run_id":'
          .. cjson.encode(ARGV[1]) .. ',"call_id":' .. cjson.encode(d.call_id)
          .. ',"deadline":' .. string.format('%d', held.deadline) .. channels .. '}')
        channels = '' -- the channels show the expiry, not a rejection
      end
      outbox(d.decided_id, ARGV[7], '{"version":1,"type":"approval.decided","run_id":'
        .. cjson.encode(ARGV[1]) .. ',"call_id":' .. cjson.encode(d.call_id)
        .. ',"action":' .. cjson.encode(d.action)
        .. ',"decided_by":' .. cjson.encode(cjson.decode(decision).decided_by)
        .. ',"all_decided":' .. tostring(all) .. channels .. '}')
    end
  end
  table.insert(results, out)
end
return reply('ok', cjson.encode(results))
