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
-- A log is a sorted set: an entry is the member "<cost> <id>", its score
-- its instant (Unix ms, less EPOCH) plus a fraction (a multiple of STEP
-- below a half) that keeps the entries of one instant in the order they
-- were added, oldest first; past 2,048 entries in one instant, the newest
-- tie and sort by member. A take reads it whole (at most 2*max entries) and
-- writes back what changed, member by member: ZREM of the entries that
-- left the window, were taken back or changed, ZADD of new and changed
-- ones. Every write names its entry, so applying a take's writes twice
-- leaves what applying them once does. That matters after a crash: Redis
-- 7.0 replays an append-only file's torn MULTI/EXEC block together with
-- the next block, which may be the re-send of the same take (a list
-- written with RPUSH then held the entry twice). An entry decided without
-- a take ID is named "<cost> \0<at>.<n>" instead. A log left as a list
-- by an earlier version is read as such and rewritten as a sorted set.

local now, cost, mode, id = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local retention, minRecord, margin = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local nb, nl = tonumber(ARGV[8]), tonumber(ARGV[9])
local DECIDE, PEEK, REFUND, ADMITTED, REJECTED = 0, 1, 2, 3, 4
-- A log entry's score (see above): exact for instants within 2^41 ms of
-- EPOCH (2020 to 2090), where a double has 12 bits left for the fraction.
local EPOCH, STEP, MAXFRAC = 1600000000000, 1 / 4096, 2047 / 4096
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
-- take that has logs. Entries are {at, cost, id, member, score}: member
-- and score are what the set holds for an entry read from it (nil for a
-- new one).
local loadLog, idOf, prune, count, addEntry, removeEntry, takeBackEntries
if nl > 0 then
  -- score reads a score as Redis writes it ("%.17g"), or as miniredis
  -- does ("1e+11": gopher-lua's tonumber wants a point before the
  -- exponent).
  local function score(x)
    return tonumber(x) or tonumber((string.gsub(x, '^(%-?%d+)([eE])', '%1.0%2')))
  end
  -- readEntries parses a sorted set's members and scores, or (old) a
  -- list's "<at> <cost> <id>" entries; it returns nil for anything else.
  -- An entry read from the set learns its id only when it needs it (idOf).
  local function readEntries(g, raw, old)
    if type(raw) ~= 'table' or raw.err then
      return nil
    end
    local es = {}
    for i = 1, #raw, old and 1 or 2 do
      local e
      if old then
        local at, c, eid = string.match(raw[i], '^(%S+) (%S+) (.*)$')
        at, c = tonumber(at), tonumber(c)
        if at and c then
          e = {at = at, cost = c, id = eid}
        end
      else
        local sp = string.find(raw[i], ' ', 1, true)
        local c, sc = sp and tonumber(string.sub(raw[i], 1, sp - 1)), tonumber(raw[i + 1]) or score(raw[i + 1])
        if c and sc then
          e = {at = EPOCH + math.floor(sc), cost = c, member = raw[i], score = sc, cost0 = c}
        end
      end
      if e then
        es[#es + 1] = e
      else
        g.rewrite = true -- not an entry: dropped
      end
    end
    return es
  end
  idOf = function(e)
    if not e.id then
      e.id = string.match(e.member, '^%S+ (.*)$')
      if string.byte(e.id, 1) == 0 then
        e.id = '' -- decided without a take ID
      end
    end
    return e.id
  end
  loadLog = function(key)
    local g = {key = key, rewrite = false}
    g.entries = readEntries(g, redis.pcall('ZRANGE', key, 0, -1, 'WITHSCORES'), false)
    if not g.entries then
      g.rewrite = true -- a list of an earlier version, or another type
      g.entries = readEntries(g, redis.pcall('LRANGE', key, 0, -1), true) or {}
    end
    g.read = {}
    for i, e in ipairs(g.entries) do
      if g.rewrite then -- written anew after a DEL
        e.id = e.id or idOf(e)
        e.member, e.score = nil, nil
      else
        g.read[i] = e
      end
    end
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
        return
      end
    end
    es[n + 1] = {at = at, cost = cost, id = id}
  end
  -- slidelog.Log.Remove
  removeEntry = function(g)
    for i, e in ipairs(g.entries) do
      if idOf(e) == id then
        table.remove(g.entries, i)
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
        return
      end
      c = c - last.cost
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

-- writeLog writes log g back (see the top of the file): ZREM of every
-- member read that no entry keeps, ZADD of every entry that is new or
-- changed (its member, its score or both), then the TTL.
local function writeLog(g, window)
  local es = g.entries
  if g.rewrite then
    redis.call('DEL', g.key)
  end
  local adds, used = {}, nil
  local prev -- the score of the entry before
  for _, e in ipairs(es) do
    local base = e.at - EPOCH
    local sc
    if e.score and math.floor(e.score) == base and (not prev or e.score > prev) then
      sc = e.score -- where it was
    elseif prev and math.floor(prev) == base then
      sc = math.min(prev + STEP, base + MAXFRAC) -- after the one before
    else
      sc = base
    end
    prev = sc
    local m = e.member
    if not m or e.cost ~= e.cost0 then
      if idOf(e) ~= '' then
        m = str(e.cost) .. ' ' .. e.id
      else
        if not used then -- the members an unnamed entry must not take
          used = {}
          for _, r in ipairs(g.read) do
            used[r.member] = true
          end
        end
        local n, name = 0, str(e.cost) .. ' \0' .. str(e.at) .. '.'
        m = name .. n
        while used[m] do
          n = n + 1
          m = name .. n
        end
        used[m] = true
      end
    end
    e.kept = m == e.member
    if not e.kept or sc ~= e.score then
      adds[#adds + 1] = str(sc)
      adds[#adds + 1] = m
    end
  end
  local rems = {}
  for _, r in ipairs(g.read) do
    if not r.kept then
      rems[#rems + 1] = r.member
    end
  end
  for i = 1, #rems, 1000 do
    redis.call('ZREM', g.key, unpack(rems, i, math.min(i + 999, #rems)))
  end
  for i = 1, #adds, 2000 do
    redis.call('ZADD', g.key, unpack(adds, i, math.min(i + 1999, #adds)))
  end
  if #es > 0 then
    -- Kept until its newest entry leaves the window.
    redis.call('PEXPIRE', g.key, math.max(1, es[#es].at + window - now + margin))
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
    writeLog(g, l.window)
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
