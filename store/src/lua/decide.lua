-- Decides held calls: the one place where a decision becomes true. Every check is made here,
-- against the held calls as the pause stored them (turn, digest, who may decide, quorum,
-- self-approval, deadline) and the run's requester, in the same atomic step that records the
-- decisions, appends their audit entries and queues their announcements in the outbox. All
-- decisions of one request are checked before any is recorded; a refusal changes nothing but
-- the run's capped list of refusals.
-- `by` is 'deadline' when the deadline decides, 'policy' when a changed policy closes a call
-- that waited (superseded, so its run is checked again), empty when a person does; neither
-- of the first two is checked as a person is. `role_decides` is '1' when the principal's role
-- decides (see `authority.rs`: the gateway's configuration knows roles, this script the held
-- calls); `link_key`, when given, is the email link used, spent with the decision if it
-- still holds `grant`. Tail: the count of decisions, then each (see `read_proposed`).
-- With `receipts` '1', a decision that lets a call run carries its receipt in its JSON and
-- names in `receipt_for` who the receipt says decided.
-- `under_grant`, when not empty, is the standing grant deciding the calls (JSON; `principal`
-- is then the name the decision records, `alice, under grant grt_…`): its agent, tool,
-- policy version and requester must be the run's and the call's as stored, whatever the
-- message that brought the call to the gateway said; everyone who made it is checked as if
-- deciding, and together they must make the call's quorum.
-- `delegated`, when not empty, is the delegation a person decides under (JSON, `from` and
-- `to`; the gateway took a use of it first, atomic with ending it): `principal` is then the
-- name the decision records (`carol for alice`), `to` is checked against the requester and
-- `from` against the call's deciders. One person's approval counts once on a call that needs
-- several, under whichever name: as themselves, as someone's delegate, or through theirs.
-- `by` is 'model' when a reviewer model approves (see `authority.rs`, `may_model_approve`):
-- `principal` is its name, `model:NAME@VERSION`, and the held call must carry exactly that
-- name in `model_approves`, stored with the pause from the model's verdict; only an approval,
-- checked against nothing else a person is (approvers, requester). No other decision may
-- name a model.
-- Replies {'ok', results JSON, outbox...}, {'refused', refusal JSON}, or {'missing', ''}.
local expiry = by == 'deadline'
local by_policy = by == 'policy'
local by_model = by == 'model'
local system = expiry or by_policy
local run = redis.call('HMGET', run_key, 'status', 'cancel', 'turn', 'requested_by',
  'pending_count', 'decided_count', 'version', 'agent')
local status = run[1]
if not status then return {'missing', ''} end

local function refuse(d, code, detail)
  local why = {call_id = d.call_id, code = code, detail = detail or ''}
  if not system then
    why.at = now_ms()
    why.actor = principal
    why.channel = door
    why.action = d.action
    redis.call('LPUSH', refusals_key, cjson.encode(why))
    redis.call('LTRIM', refusals_key, 0, 99)
    local ttl = redis.call('PTTL', run_key)
    if ttl > 0 then redis.call('PEXPIRE', refusals_key, ttl) end
  end
  return {'refused', cjson.encode(why)}
end

-- Everyone who has approved `call_id` so far, of a call that needs several approvals, sorted.
local function approvers(call_id)
  local names = {}
  local prefix = call_id .. '|'
  for _, field in ipairs(redis.call('HKEYS', votes_key)) do
    if string.sub(field, 1, #prefix) == prefix then
      table.insert(names, string.sub(field, #prefix + 1))
    end
  end
  table.sort(names)
  return names
end

-- (Not named `grant`: that is the email link's, checked below.)
local standing = nil
local granters = nil
if under_grant ~= '' then
  standing = cjson.decode(under_grant)
  granters = standing.granted_by
end
-- Which of the grant's terms `held` (of this run) does not meet; nil when it meets them all.
-- A run stored before runs kept their agent beside the document meets no grant.
local function grant_differs(held)
  if standing.agent ~= run[8] then return 'agent' end
  if standing.tool ~= held.tool then return 'tool' end
  if standing.policy_version ~= held.policy_version then return 'policy version' end
  if standing.requester and standing.requester ~= run[4] then return 'requester' end
  return nil
end
local delegation = nil
if delegated ~= '' then delegation = cjson.decode(delegated) end
-- Who is deciding, each checked: the principal, everyone who made the grant, or the delegate.
local deciding = granters or {principal}
if delegation then deciding = {delegation.to} end
-- A model is checked against its stored approval alone (below).
if by_model then deciding = {} end

-- Whether `person`'s approval of `call_id` counts already under a name other than `name`:
-- as themselves, as someone's delegate (`person for x`), or through their delegate (`x for
-- person`).
local function counted_otherwise(call_id, person, name)
  local prefix = call_id .. '|'
  local as_delegate = person .. ' for '
  local through = ' for ' .. person
  for _, field in ipairs(redis.call('HKEYS', votes_key)) do
    if string.sub(field, 1, #prefix) == prefix then
      local voter = string.sub(field, #prefix + 1)
      if voter ~= name and (voter == person
          or string.sub(voter, 1, #as_delegate) == as_delegate
          or (#voter > #through and string.sub(voter, -#through) == through)) then
        return true
      end
    end
  end
  return false
end

local decisions = {}
local p = tail + 1
for i = 1, tonumber(ARGV[tail]) do
  decisions[i], p = read_proposed(p)
end

-- First every decision is checked: nothing is decided on a run someone asked to cancel, and
-- nothing by a principal whose role does not decide.
if run[2] or status == 'cancelled' then return refuse(decisions[1], 'run_cancelled', status) end
if not system and not by_model and role_decides ~= '1' then
  return refuse(decisions[1], 'role_may_not_decide')
end
if not by_model and string.sub(principal, 1, 6) == 'model:' then
  return refuse(decisions[1], 'model_name')
end
local now = now_ms()
local turn = run[3]
local requester = run[4]
for _, d in ipairs(decisions) do
  local existing = redis.call('HGET', decisions_key, d.call_id)
  if existing then
    local e = cjson.decode(existing)
    if system then return {'settled', existing} end
    -- A repeat is answered only to the one who decided, about what they were shown.
    local same = e.fingerprint == d.fingerprint and e.digest == d.digest and not e.expired
      and (e.decided_by == principal
        or redis.call('HEXISTS', votes_key, d.call_id .. '|' .. principal) == 1)
    if not same then return refuse(d, 'decided', existing) end
    d.result = 'already_recorded'
  else
    if status ~= 'awaiting_approval' then return refuse(d, 'not_waiting', status) end
    local raw = redis.call('HGET', calls_key, d.call_id)
    if not raw then return refuse(d, 'no_call') end
    local held = cjson.decode(raw)
    if tostring(held.turn) ~= turn then return refuse(d, 'no_call') end
    if held.digest ~= d.digest then return refuse(d, 'stale_digest', held.digest) end
    d.held = held
    if expiry then
      if not held.deadline or now < held.deadline then return {'not_due', ''} end
    elseif not by_policy then
      if held.deadline and now >= held.deadline and not held.escalates then
        return refuse(d, 'past_deadline', tostring(held.deadline))
      end
      if by_model and (held.model_approves ~= principal or d.action ~= 'approve'
          or held.quorum > 1) then
        return refuse(d, 'no_model_approval', held.model_approves or '')
      end
      for _, who in ipairs(deciding) do
        if held.deciders then
          -- A delegate takes the place of the person who delegated.
          local listed_as = who
          if delegation then listed_as = delegation.from end
          local listed = false
          for _, p in ipairs(held.deciders) do
            if p == listed_as then listed = true end
          end
          if not listed then return refuse(d, 'not_approver', cjson.encode(held.deciders)) end
        end
        if d.action ~= 'reject' and not held.self_ok and requester == who then
          return refuse(d, 'own_request')
        end
      end
      if standing then
        local differs = grant_differs(held)
        if differs then return refuse(d, 'grant_mismatch', differs) end
      end
      if granters and #granters < held.quorum then
        return refuse(d, 'grant_short', tostring(held.quorum))
      end
      local votes = held.quorum > 1 and not granters
      if d.action == 'edit' then
        if held.quorum > 1 then return refuse(d, 'edit_with_quorum', tostring(held.quorum)) end
        if d.checked ~= d.digest then return refuse(d, 'edit_unchecked') end
      end
      if votes and d.action == 'approve'
        and redis.call('HEXISTS', votes_key, d.call_id .. '|' .. principal) == 1 then
        d.result = 'already_voted'
      end
      if votes and d.action == 'approve' and not d.result then
        local people = {principal}
        if delegation then people = {delegation.to, delegation.from} end
        for _, person in ipairs(people) do
          if counted_otherwise(d.call_id, person, principal) then
            return refuse(d, 'counted_otherwise', person)
          end
        end
      end
      -- A decision that lets the call run carries the receipt of exactly that decision: the
      -- gateway signed it for who it expected to complete it, which another approval of a
      -- quorum may have changed since.
      -- (At a stage before the last, `runs_on` says neither approving nor editing lets the
      -- call run, so neither carries a receipt.)
      local runs = d.action ~= 'reject'
      if runs and held.runs_on then
        runs = false
        for _, a in ipairs(held.runs_on) do
          if a == d.action then runs = true end
        end
      end
      if receipts == '1' and runs and not d.result then
        local names = {principal}
        local final = true
        if granters then
          names = {}
          for _, who in ipairs(granters) do table.insert(names, who) end
          table.sort(names)
        elseif votes then
          local approvals = tonumber(redis.call('HGET', votes_key, d.call_id .. '#') or '0')
          final = approvals + 1 >= held.quorum
          names = approvers(d.call_id)
          table.insert(names, principal)
          table.sort(names)
        end
        local expected = final and table.concat(names, ', ') or ''
        if d.receipt_for ~= expected then
          -- Not the reviewer's refusal: the gateway signs again and retries, so it is not
          -- kept with the run's refusals.
          return {'refused', cjson.encode({call_id = d.call_id, code = 'receipt_stale', detail = expected})}
        end
        -- Who the recorded decision names, once this approval completes it.
        if final then d.names = expected end
      end
    end
  end
end
if link_key and redis.call('GET', link_key) ~= grant then
  return refuse(decisions[1], 'link_used')
end

-- Then all are recorded, audited and announced.
marked()
-- A spent link keeps its grant, marked, until it expires: its page can still say what it
-- was for and how that ended, and it decides nothing again.
if link_key then redis.call('SET', link_key, 'spent:' .. grant, 'KEEPTTL') end
local results = {}
local version = tonumber(run[7])
local decided = tonumber(run[6])
for _, d in ipairs(decisions) do
  local out = {call_id = d.call_id, status = d.result}
  if not d.result then
    local held = d.held
    local decision = d.json
    append_audit(d.entry, d.sha, d.prev_guess, d.link)
    version = version + 1
    local final = true
    if held.quorum > 1 and not granters and d.action == 'approve' then
      redis.call('HSET', votes_key, d.call_id .. '|' .. principal, decision)
      local approvals = redis.call('HINCRBY', votes_key, d.call_id .. '#', 1)
      out.approvals = approvals
      out.quorum = held.quorum
      if approvals < held.quorum then
        final = false
        out.status = 'approval_recorded'
      else
        -- The quorum is met: the decision names everyone who approved.
        local merged = cjson.decode(decision)
        merged.decided_by = d.names or table.concat(approvers(d.call_id), ', ')
        decision = cjson.encode(merged)
      end
    end
    if final then
      redis.call('HSET', decisions_key, d.call_id, decision)
      decided = decided + 1
      local all = decided >= tonumber(run[5])
      out.status = 'recorded'
      out.all_decided = all
      -- The channels the call was sent to (as stored, escalation included) show the outcome;
      -- after an expiry they show the expiry, not a rejection.
      local channels = nil
      if held.channels and #held.channels > 0 then channels = held.channels end
      if expiry then
        outbox(d.expired_id, expired_subject,
          event(d.expired_event, {deadline = held.deadline, channels = channels}))
        channels = nil
      end
      outbox(d.decided_id, decided_subject, event(d.decided_event, {
        all_decided = all, decided_by = cjson.decode(decision).decided_by, channels = channels}))
    end
  end
  table.insert(results, out)
end
if version > tonumber(run[7]) then flush({'version', version, 'decided_count', decided}) end
return reply('ok', cjson.encode(results))
