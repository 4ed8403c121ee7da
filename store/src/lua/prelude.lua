-- Shared by every script (prepended to each, since scripts cannot call each other), after
-- the header that names the script's KEYS and ARGV as locals (see `script.rs`): a script on a
-- run has the run's keys (`run_key`, `calls_key`, … `refusals_key`, all under its hash tag,
-- and the list of them, `run_keys`), its shard's (`outbox_index_key` … `reminders_key`, see
-- `marked`), `run_id`, `audit_subject`, `mark` and `index`, then its own arguments, then its
-- tail from `tail`.

local band, bor, bxor, bnot = bit.band, bit.bor, bit.bxor, bit.bnot
local rshift, lshift, ror, tobit = bit.rshift, bit.lshift, bit.ror, bit.tobit

local K256 = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

local function be32(x)
  return string.char(math.floor(x / 16777216) % 256, math.floor(x / 65536) % 256,
    math.floor(x / 256) % 256, x % 256)
end

-- SHA-256 as lowercase hex. Redis offers only SHA-1 to scripts, and the audit chain is
-- SHA-256; its input here is two hashes (64 bytes), so this costs two blocks per entry.
local function sha256(msg)
  local len = #msg
  msg = msg .. '\128' .. string.rep('\0', (55 - len) % 64)
    .. be32(math.floor(len / 536870912)) .. be32((len * 8) % 4294967296)
  local h = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
             0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}
  local w = {}
  for i = 1, #msg, 64 do
    for j = 0, 15 do
      local p = i + j * 4
      local b1, b2, b3, b4 = string.byte(msg, p, p + 3)
      w[j] = bor(lshift(b1, 24), lshift(b2, 16), lshift(b3, 8), b4)
    end
    for j = 16, 63 do
      local x, y = w[j - 15], w[j - 2]
      local s0 = bxor(ror(x, 7), ror(x, 18), rshift(x, 3))
      local s1 = bxor(ror(y, 17), ror(y, 19), rshift(y, 10))
      w[j] = tobit(w[j - 16] + s0 + w[j - 7] + s1)
    end
    local a, b, c, d, e, f, g, hh = h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8]
    for j = 0, 63 do
      local s1 = bxor(ror(e, 6), ror(e, 11), ror(e, 25))
      local ch = bxor(band(e, f), band(bnot(e), g))
      local t1 = hh + s1 + ch + K256[j + 1] + w[j]
      local s0 = bxor(ror(a, 2), ror(a, 13), ror(a, 22))
      local maj = bxor(band(a, b), band(a, c), band(b, c))
      hh, g, f, e, d, c, b, a = g, f, e, tobit(d + t1), c, b, a, tobit(t1 + s0 + maj)
    end
    h[1], h[2], h[3], h[4] = tobit(h[1] + a), tobit(h[2] + b), tobit(h[3] + c), tobit(h[4] + d)
    h[5], h[6], h[7], h[8] = tobit(h[5] + e), tobit(h[6] + f), tobit(h[7] + g), tobit(h[8] + hh)
  end
  local out = {}
  for i = 1, 8 do out[i] = bit.tohex(h[i], 8) end
  return table.concat(out)
end

-- What the script adds to the run's audit trail and outbox is gathered here and written by one
-- command each in `flush` (still within the script's one atomic step): the outbox entries,
-- also returned to the caller so it can publish them at once; the new audit elements; the
-- run's audit head, read at most once.
local written = {}
local flushed = 0
local elements = {}
local head = nil

local function audit_head()
  if head == nil then head = redis.call('HGET', run_key, 'audit_head') or '' end
  return head
end

-- Writes what was gathered, with `fields` (a flat list of the run hash's fields and values,
-- if given) in the same HSET as the new audit head. A script that queued or audited anything
-- calls it (through `reply`, or before it sets expiries) before it ends.
local function flush(fields)
  fields = fields or {}
  if #elements > 0 then
    in_chunks('RPUSH', audit_key, elements)
    elements = {}
    table.insert(fields, 'audit_head')
    table.insert(fields, head)
  end
  if #fields > 0 then redis.call('HSET', run_key, unpack(fields)) end
  in_chunks('HSET', outbox_key, written, flushed + 1)
  flushed = #written
end

-- Every outbox write follows a mark of the run in the outbox index: in the same step on one
-- server (`mark` 0: this script marks the run and changes its shard's indexes as `index`
-- says), or under Cluster by a script of its own made at most two seconds before, so a
-- sweeper that finds a mark older than its grace period (longer than that) and the outbox
-- empty knows no write of that mark is still on its way. Called before the first write.
local function marked()
  if tonumber(mark) == 0 then
    shard_step(outbox_index_key, awaiting_key, deadlines_key, reminders_key, run_id, index)
  elseif now_ms() - tonumber(mark) > 2000 then
    error('STALE_MARK the outbox mark is too old; mark the run again')
  end
end

-- Queues a message for NATS in the run's outbox; a publisher sends it with its message id
-- and deletes it after JetStream's ack.
local function outbox(msg_id, subject, payload)
  table.insert(written, msg_id)
  table.insert(written, subject .. '\n' .. payload)
end

-- An event the caller serialized (`json`, the whole envelope) with the facts only this
-- script holds set on it by name: the shape of every payload is Rust's (`events.rs`).
local function event(json, facts)
  local e = cjson.decode(json)
  for field, value in pairs(facts) do e[field] = value end
  return cjson.encode(e)
end

-- The script's answer, once what it gathered is written: a status, a detail, the run's audit
-- head (so the caller's next links start from it), then the outbox entries it wrote.
local function reply(status, detail)
  flush()
  local out = {status, detail or '', audit_head()}
  for i = 1, #written do out[#out + 1] = written[i] end
  return out
end

local function unhex(s)
  return (string.gsub(s, '..', function(h) return string.char(tonumber(h, 16)) end))
end

-- Appends one entry to the run's hash chain: `entry` is its canonical JSON and `entry_sha`
-- the SHA-256 of that, computed by the caller; the link is the SHA-256 of the previous
-- link's 32 bytes followed by the entry's 32. The caller also sends the link it computed from
-- the head it believed (`prev_guess`): when that is the head, its link is taken, and only
-- otherwise (another process appended meanwhile) is the link computed here, in Lua, which
-- costs far more than the rest of a script. The element also goes to the global audit log,
-- through the outbox. Returns the new head.
local function append_audit(entry, entry_sha, prev_guess, link)
  local prev = audit_head()
  local hash = link
  if prev ~= prev_guess then hash = sha256(unhex(prev) .. unhex(entry_sha)) end
  local element = '{"prev":"' .. prev .. '","hash":"' .. hash .. '","entry":' .. entry .. '}'
  table.insert(elements, element)
  head = hash
  outbox('audit:' .. run_id .. ':' .. hash, audit_subject, element)
  return hash
end

-- Appends the audit entries given as ARGV[from] = count, then count audit links (see
-- `read_audit_link`); returns the index after them.
local function append_audits(from)
  local p = from + 1
  for _ = 1, tonumber(ARGV[from]) do
    local a
    a, p = read_audit_link(p)
    append_audit(a.entry, a.sha, a.prev_guess, a.link)
  end
  return p
end

-- Queues the messages given as ARGV[from] = count, then count messages (see `read_queued`);
-- returns the index after them.
local function outbox_args(from)
  local p = from + 1
  for _ = 1, tonumber(ARGV[from]) do
    local q
    q, p = read_queued(p)
    outbox(q.msg_id, q.subject, q.payload)
  end
  return p
end
