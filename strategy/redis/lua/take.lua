-- take.lua decides a Take on one key's token buckets and sliding logs,
-- atomically and once per Take ID: strategy.Taker, following the memory
-- store's take.go and internal/slidelog step by step.
--
--   KEYS[1]    the Take's record: its decision, kept while any of its
--              limits may hold its cost
--   KEYS[2..]  one key per bucket, then one per log
--   ARGV[1..9] now (Unix ms), cost, mode (0 decide, 1 peek, 2 refund, 3
--              answered admitted, 4 answered rejected), the Take ID (''
--              for none), strategy.BucketRetention ms, the least time a
--              record is kept (ms), the margin added to every TTL (ms),
--              the number of buckets nb and of logs nl
--   then per bucket: period ms, interval, burst, penalty ('1' or '0')
--   then per log: window ms, max, penalty
--
-- It returns 1 (allowed) or 0, every bucket's state ("<tat> <interval>",
-- false for none), then every log's count, fits and empty (strategy.LogState).
--
-- A log is a list of entries "<at> <cost> <id>", oldest first. A take
-- reads it whole (at most 2*max entries) and writes back what changed: the
-- entries that left the window (LTRIM), the entries taken back from the
-- end (the same LTRIM), the newest entry when it changed (LSET), new ones
-- (RPUSH); a removal from the middle rewrites the list.

local now, cost, mode, id = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local retention, minRecord, margin = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local nb, nl = tonumber(ARGV[8]), tonumber(ARGV[9])
local DECIDE, PEEK, REFUND, ADMITTED, REJECTED = 0, 1, 2, 3, 4
bucketing()

-- bucketFits is strategy.BucketFits: the time the bucket owes, max(tat -
-- now, 0) (exact: the two are close), against what the request leaves,
-- (burst - cost) * interval. now + cost * interval would round at 1.7e12 ms.
local function bucketFits(t, iv, interval, burst)
  local owed = 0
  if t then
    owed = convertTAT(t, iv, interval, now) - now
  end
  if owed <= 0 then
    return cost <= burst
  end
  return owed <= (burst - cost) * interval
end

-- The common take first, straight through: one bucket, no log, decided
-- under an ID seen for the first time (SET NX GET records the decision and
-- tells whether one was recorded). Anything else (and a decision recorded
-- before) goes the general way below, which this path has not written for.
if nb == 1 and nl == 0 and mode == DECIDE and id ~= '' then
  local key, period, interval, burst = KEYS[2], tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
  local t, iv = bucket(key)
  local add = cost * interval
  local ok = bucketFits(t, iv, interval, burst)
  local tat = t
  local spent = ok or ARGV[13] == '1'
  if spent then
    tat = applyBucket(t, iv, add, now + add, interval, now)
  end
  local e = now + minRecord
  if tat then
    e = math.max(e, math.ceil(tat) + period + retention)
  end
  local old = redis.pcall('SET', KEYS[1], ok and '1' or '0', 'NX', 'GET', 'PX', e - now + margin)
  if not old then
    if spent then
      return {ok and 1 or 0, setBucket(key, tat, interval, period, now, retention, margin)}
    end
    return {ok and 1 or 0, t and string.format('%.17g %.17g', t, iv) or false}
  end
end

local buckets, logs = {}, {}
local a = 10
for i = 1, nb do
  buckets[i] = {key = KEYS[1 + i], period = tonumber(ARGV[a]), interval = tonumber(ARGV[a + 1]),
    burst = tonumber(ARGV[a + 2]), penalty = ARGV[a + 3] == '1'}
  a = a + 4
end
for j = 1, nl do
  logs[j] = {key = KEYS[1 + nb + j], window = tonumber(ARGV[a]), max = tonumber(ARGV[a + 1]), penalty = ARGV[a + 2] == '1'}
  a = a + 3
end

-- The sliding log's operations (internal/slidelog), defined only for a
-- take that has logs. Entries are {at, cost, id}. base counts the leading
-- entries that match the stored list once trim entries are cut from its
-- head and pop from its tail; entries after base are new.
local loadLog, prune, count, addEntry, removeEntry, takeBackEntries
if nl > 0 then
  loadLog = function(key)
    local g = {key = key, entries = {}, base = 0, trim = 0, pop = 0, setlast = false, rewrite = false}
    local raw = redis.pcall('LRANGE', key, 0, -1)
    if type(raw) ~= 'table' or raw.err then
      g.rewrite = true -- another type: replaced
      return g
    end
    for _, e in ipairs(raw) do
      local at, c, eid = string.match(e, '^(%S+) (%S+) (.*)$')
      at, c = tonumber(at), tonumber(c)
      if at and c then
        g.entries[#g.entries + 1] = {at = at, cost = c, id = eid}
      else
        g.rewrite = true -- not an entry: dropped
      end
    end
    g.base = #g.entries
    return g
  end
  -- slidelog.Log.Prune
  prune = function(g, window)
    local es, i = g.entries, 0
    while i < #es and es[i + 1].at <= now - window do
      i = i + 1
    end
    if i > 0 then
      local kept = {}
      for j = i + 1, #es do
        kept[#kept + 1] = es[j]
      end
      g.entries = kept
      g.trim = g.trim + i
      g.base = g.base - i
    end
  end
  -- slidelog.Log.Count
  count = function(g)
    local s = 0
    for _, e in ipairs(g.entries) do
      s = s + e.cost
    end
    return s
  end
  -- changedLast notes that the newest entry changed.
  local function changedLast(g)
    if #g.entries <= g.base then
      g.setlast = true
    end
  end
  -- slidelog.Log.Add
  addEntry = function(g, max)
    local es, at = g.entries, now
    local n = #es
    if n > 0 then
      local last = es[n]
      at = math.max(at, last.at)
      if n >= 2 * math.max(max, 1) then
        last.cost = last.cost + cost
        last.at = at
        changedLast(g)
        return
      end
    end
    es[n + 1] = {at = at, cost = cost, id = id}
  end
  -- slidelog.Log.Remove
  removeEntry = function(g)
    for i, e in ipairs(g.entries) do
      if e.id == id then
        table.remove(g.entries, i)
        g.rewrite = true
        return
      end
    end
  end
  -- slidelog.Log.TakeBack
  takeBackEntries = function(g, c)
    local es = g.entries
    while c > 0 and #es > 0 do
      local last = es[#es]
      if last.cost > c then
        last.cost = last.cost - c
        changedLast(g)
        return
      end
      c = c - last.cost
      if #es <= g.base then
        g.pop = g.pop + 1
        g.base = g.base - 1
      end
      es[#es] = nil
    end
  end
end

-- load (re)reads the buckets' states and the logs (pruned), each shared by
-- key: two limits of one period are one bucket, as in the memory store.
local function load()
  local states, byKey = {}, {}
  for _, b in ipairs(buckets) do
    local s = states[b.key]
    if not s then
      s = {}
      s.tat, s.iv = bucket(b.key)
      states[b.key] = s
    end
    b.state = s
  end
  for _, l in ipairs(logs) do
    local g = byKey[l.key]
    if not g then
      g = loadLog(l.key)
      byKey[l.key] = g
    end
    prune(g, l.window)
    l.log = g
  end
end
load()

local function spendBucket(b)
  local s, add = b.state, cost * b.interval
  s.tat = applyBucket(s.tat, s.iv, add, now + add, b.interval, now)
  s.iv, s.period, s.dirty = b.interval, b.period, true
end

local function refundBucket(b)
  local s = b.state
  s.tat = applyBucket(s.tat, s.iv, -(cost * b.interval), now, b.interval, now)
  s.iv, s.period, s.dirty = b.interval, b.period, true
end

-- fits is strategy.BucketFits on every bucket, slidelog.Log.Fits on every
-- log.
local function fits()
  for _, b in ipairs(buckets) do
    if not bucketFits(b.state.tat, b.state.iv, b.interval, b.burst) then
      return false
    end
  end
  for _, l in ipairs(logs) do
    if count(l.log) + cost > l.max then
      return false
    end
  end
  return true
end

-- spend spends the cost on every limit (admitted) or on those with a
-- penalty (rejected); unpenalized, on those without one.
local function spend(admitted, unpenalized)
  for _, b in ipairs(buckets) do
    if (unpenalized and not b.penalty) or (not unpenalized and (admitted or b.penalty)) then
      spendBucket(b)
    end
  end
  for _, l in ipairs(logs) do
    if (unpenalized and not l.penalty) or (not unpenalized and (admitted or l.penalty)) then
      addEntry(l.log, l.max)
    end
  end
end

-- takeBack undoes an admission on the limits without a penalty.
local function takeBack()
  for _, b in ipairs(buckets) do
    if not b.penalty then
      refundBucket(b)
    end
  end
  for _, l in ipairs(logs) do
    if not l.penalty then
      removeEntry(l.log)
    end
  end
end

local function refund()
  for _, b in ipairs(buckets) do
    if b.state.tat then
      refundBucket(b)
    end
  end
  for _, l in ipairs(logs) do
    takeBackEntries(l.log, cost)
  end
end

-- takeEnd returns the record's TTL: as long as any limit may hold the
-- cost, a minute at least (the memory store's takeEnd), plus the margin.
local function takeEnd()
  local e = now + minRecord
  for _, b in ipairs(buckets) do
    if b.state.tat then
      e = math.max(e, math.ceil(b.state.tat) + b.period + retention)
    end
  end
  for _, l in ipairs(logs) do
    e = math.max(e, now + l.window)
  end
  return e - now + margin
end

local allowed = true
if mode == DECIDE and id ~= '' then
  -- The common case, with one command for the record: decide, then record
  -- the decision unless one is recorded under the ID already.
  allowed = fits()
  spend(allowed, false)
  local mark = allowed and '1' or '0'
  local old = redis.pcall('SET', KEYS[1], mark, 'NX', 'GET', 'PX', takeEnd())
  if type(old) == 'table' then -- a key of another type: replaced
    redis.call('DEL', KEYS[1])
    old = redis.call('SET', KEYS[1], mark, 'NX', 'GET', 'PX', takeEnd())
  end
  if old then
    -- Decided before: that decision stands, and this one is undone.
    load()
    allowed = old == '1'
    redis.call('SET', KEYS[1], old, 'PX', takeEnd())
  end
else
  local seen, recorded = false, false
  if id ~= '' then
    local r = redis.pcall('GET', KEYS[1])
    if type(r) == 'string' then
      seen, recorded = true, r == '1'
    end
  end
  if mode == PEEK then
    allowed = fits()
  elseif mode == REFUND then
    if not seen then
      refund()
    end
  elseif mode == ADMITTED or mode == REJECTED then
    allowed = mode == ADMITTED
    if not seen then
      spend(allowed, false)
    elseif recorded and not allowed then
      takeBack() -- the store admitted what the node rejected
    elseif not recorded and allowed then
      spend(true, true) -- the store rejected what the node admitted
    end
  else -- decided without an ID: nothing recorded
    allowed = fits()
    spend(allowed, false)
  end
  if mode ~= PEEK and id ~= '' then
    if type(redis.pcall('SET', KEYS[1], allowed and '1' or '0', 'PX', takeEnd())) == 'table' then
      redis.call('DEL', KEYS[1])
      redis.call('SET', KEYS[1], allowed and '1' or '0', 'PX', takeEnd())
    end
  end
end

-- Write back what changed, and answer.
local out = {allowed and 1 or 0}
local written = {}
for i, b in ipairs(buckets) do
  local s = b.state
  if not s.tat then
    out[1 + i] = false
  elseif s.dirty and not written[b.key] then
    s.enc = setBucket(b.key, s.tat, s.iv, s.period, now, retention, margin)
    written[b.key] = true
    out[1 + i] = s.enc
  else
    out[1 + i] = s.enc or (str(s.tat) .. ' ' .. str(s.iv))
  end
end
local n = 1 + nb
for _, l in ipairs(logs) do
  local g = l.log
  local es = g.entries
  if not g.done then
    g.done = true
    if g.rewrite then
      redis.call('DEL', g.key)
      g.base = 0
    elseif g.trim > 0 or g.pop > 0 then
      redis.call('LTRIM', g.key, g.trim, -1 - g.pop)
    end
    local function enc(e)
      return str(e.at) .. ' ' .. str(e.cost) .. ' ' .. e.id
    end
    if g.setlast and g.base > 0 then
      redis.call('LSET', g.key, -1, enc(es[g.base]))
    end
    for i = g.base + 1, #es, 1000 do
      local batch = {}
      for k = i, math.min(i + 999, #es) do
        batch[#batch + 1] = enc(es[k])
      end
      redis.call('RPUSH', g.key, unpack(batch))
    end
    if #es > 0 then
      -- Kept until its newest entry leaves the window.
      redis.call('PEXPIRE', g.key, math.max(1, es[#es].at + l.window - now + margin))
    end
  end
  -- slidelog.Log.State
  local total = count(g)
  local fitsAt, emptyAt = now, now
  if #es > 0 then
    emptyAt = math.max(now, es[#es].at + l.window)
  end
  local left, i = total, 1
  while left + cost > l.max and i <= #es do
    left = left - es[i].cost
    fitsAt = math.max(now, es[i].at + l.window)
    i = i + 1
  end
  out[n + 1], out[n + 2], out[n + 3] = total, fitsAt, emptyAt
  n = n + 3
end
return out
