-- push.lua applies one batch part: the diffs and bucket diffs of one hash
-- tag, exactly once, and answers the part's watches.
--
--   KEYS[1]    the batch-part id
--   KEYS[2..]  per window: its hash, and when the part writes or watches
--              it, its version key, change log and markers; then one key
--              per bucket diff
--   ARGV[1]    the batch-part id's TTL in ms; "0" skips the id (test hook)
--   ARGV[2]    the bound totals saturate at (strategy.MaxTotal)
--   ARGV[3..5] the number of windows, of bucket diffs, of watches
--   then, with bucket diffs: the batch's Now (Unix ms),
--              strategy.BucketRetention in ms, the margin added to every
--              bucket's TTL (ms)
--   then, with watches: a random incarnation in [1, 2^28] for a window
--              a watch starts
--   then per window: the number of its keys (1 or 4), the number of
--              diffs nd and of reads nr, and with 4 keys its TTL in ms and
--              the number of the batch's diffs of the window in this hash
--              tag (all its parts'); then nd (field, delta) pairs, nr fields
--   then per bucket diff: period ms, add, floor, interval
--   then per watch: the window's index (from 1), the limit, the cursor
--              ('=' asks for the part's version of the window only)
--
-- It returns 1 (0 for a part applied before: nothing was applied again),
-- then per window the total of every diff and every read, then every
-- bucket diff's state ("<tat> <interval>"), then every watch's answer (see
-- answer).
--
-- No runtime error can stop the script after its first write, which would
-- leave a part half applied behind an id that makes a re-send take it for
-- applied: the commands that could fail on data (an increment of a field
-- that is not an integer or would overflow, a key of another type) run under
-- pcall, and their failures are settled in place: a key of another type in
-- the Store's key space is replaced, a field that is not an integer restarts
-- from 0, and a total saturates at ±ARGV[2]. SET NX is the first write, so a
-- refusal of the first write (OOM, READONLY, ...) leaves nothing behind.
-- A window's keys get their TTL whenever a field may have been created (its
-- total equals its delta); an increment of a field that already held a
-- total does not refresh it: the keys got their TTL when the field was
-- created, and nothing removes a TTL. A watched window's changes get a
-- version and are logged; a batch that changes at least half of a window's
-- fields (and at least MINMARK) marks its version instead of logging each
-- field (see mark).
--
-- Replicas and the append-only file get a window's new totals (one HSET),
-- not its increments: the counters' writes are not propagated
-- (redis.set_repl), their results are, once the window's diffs are
-- applied. The script's writes reach the file as one MULTI/EXEC block, and
-- a SIGKILL while Redis writes it may cut the file inside the block; Redis
-- (7.0, and Valkey before its fix for a short read in MULTI) then truncates
-- it after the last whole command, inside the block, and leaves the block
-- there without its EXEC, and a later start runs it with the next block
-- (at that block's EXEC, a nested MULTI being refused). The part, whose reply the kill lost, was applied again
-- when re-sent (the Redis that loaded the cut file had not run it), so
-- replayed increments would count its diffs twice; replayed totals are
-- overwritten by the re-send's, which are the same, and by every later
-- write's (chaos/store TestTornTransactionTail).

local EXACT = 9007199254740992 -- 2^53: integers below it are exact in a Lua number

local fresh = true
if ARGV[1] ~= '0' then
  fresh = redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1])
end
local bound = tonumber(ARGV[2])
local nw, nbd, nwa = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local a = 6
local now, retention, margin, token
if nbd > 0 then
  bucketing()
  now, retention, margin = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
end
if nwa > 0 then
  watching()
  token = tonumber(ARGV[a])
  a = a + 1
end

local function get(key, field)
  local v = redis.pcall('HGET', key, field)
  if type(v) == 'table' then
    return 0
  end
  return tonumber(v) or 0
end
-- Numbers go to Redis as strings: delta is the diff's own argument, the
-- bound ARGV[2].
local function clamp(key, field, n)
  local s = n > 0 and ARGV[2] or '-' .. ARGV[2]
  redis.call('HSET', key, field, s)
  return n > 0 and bound or -bound
end
-- add runs with propagation off (see the top): only the DEL of a key of
-- another type is propagated, before the window's totals.
local function add(key, field, delta)
  local total = redis.pcall('HINCRBY', key, field, delta)
  if type(total) == 'table' then
    local err = total.err or ''
    local d = tonumber(delta)
    if string.sub(err, 1, 9) == 'WRONGTYPE' then
      redis.set_repl(redis.REPL_ALL)
      redis.call('DEL', key)
      redis.set_repl(redis.REPL_NONE)
      total = redis.call('HINCRBY', key, field, delta)
    elseif string.find(err, 'overflow', 1, true) then
      return clamp(key, field, d)
    else -- not an integer: the field starts again from 0
      redis.call('HSET', key, field, delta)
      total = d
    end
  end
  if total > bound or total < -bound then
    return clamp(key, field, total)
  end
  return total
end

local out, n = {fresh and 1 or 0}, 1
local cur, ttls, kw = {}, {}, {}
local k = 2 -- the window's first key
for w = 1, nw do
  local hash, meta, log, marks = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local nk, nd, nr = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local ttl, nbatch
  a = a + 3
  if nk == 4 then
    ttl, nbatch = ARGV[a], tonumber(ARGV[a + 1])
    a = a + 2
  end
  ttls[w], kw[w] = ttl, k
  k = k + nk
  if fresh and nd > 0 then
    -- The part's version of a watched window (0: not watched, nothing logged).
    local v = version(meta)
    if v > 0 then
      v = redis.pcall('INCRBY', meta, 1)
      if type(v) ~= 'number' then
        v = 0
      end
    end
    cur[w] = v
    local marked = false
    if v > 0 and nbatch >= MINMARK then
      local len = redis.pcall('HLEN', hash)
      marked = type(len) ~= 'number' or 2 * nbatch >= len
    end
    local logged = v > 0 and not marked
    local z, zn, new = {}, 0, false
    -- The window's diffs, 1,000 at a time: one HMGET of their counters,
    -- the new totals worked out here, one HSET of them. That is both what
    -- Redis runs and what replicas and the append-only file get (totals,
    -- not increments: see the top). A counter whose total leaves the
    -- integers exact in a Lua number (2^53), or that does not hold a
    -- decimal integer, goes through add (HINCRBY, not propagated, with its
    -- overflow and type rules), and its total is read back as Redis holds
    -- it for the HSET.
    local seen, seenS = {}, {} -- totals (and as written) of fields met earlier in this window's diffs
    for lo = 1, nd, 1000 do
      local hi = math.min(lo + 999, nd)
      local fields = {}
      for i = lo, hi do
        fields[i - lo + 1] = ARGV[a + 2 * (i - lo)]
      end
      local vals = redis.pcall('HMGET', hash, unpack(fields))
      if type(vals) ~= 'table' or vals.err then
        vals = nil -- not a hash: add handles it, field by field
      end
      local hs, m = {}, 0
      for i = lo, hi do
        local field, delta = ARGV[a], ARGV[a + 1]
        local d = tonumber(delta)
        local c = seen[field]
        if c == nil and vals then
          c = vals[i - lo + 1]
          if not c then
            c = 0
          elseif string.find(c, '^-?%d+$') then
            c = tonumber(c)
          else
            c = nil
          end
        end
        local total, s
        if c and math.abs(c) < EXACT and math.abs(c + d) < EXACT then
          total = c + d
          s = str(total)
        else
          redis.set_repl(redis.REPL_NONE)
          if seen[field] then -- this chunk's HSET has not run: write the field's total first
            redis.call('HSET', hash, field, seenS[field])
          end
          total = add(hash, field, delta)
          redis.set_repl(redis.REPL_ALL)
          s = redis.call('HGET', hash, field)
        end
        seen[field], seenS[field] = total, s
        hs[m + 1], hs[m + 2] = field, s
        m = m + 2
        n = n + 1
        out[n] = total
        if total == d then
          new = true -- the field may be new, and so may the hash
        end
        if logged then
          z[zn + 1], z[zn + 2] = v, field
          zn = zn + 2
          if zn == 2000 then
            zadd(log, z)
            z, zn = {}, 0
          end
        end
        a = a + 2
      end
      redis.call('HSET', hash, unpack(hs))
    end
    if zn > 0 then
      zadd(log, z)
    end
    if new then
      if v > 0 then
        expire(hash, meta, log, marks, ttl)
      else
        redis.call('PEXPIRE', hash, ttl)
      end
    end
    if marked then
      mark(hash, marks, v, ttl)
    end
  else
    for i = 1, nd do
      n = n + 1
      out[n] = get(hash, ARGV[a])
      a = a + 2
    end
  end
  if nr > 0 then
    local vals = redis.pcall('HMGET', hash, unpack(ARGV, a, a + nr - 1))
    if type(vals) ~= 'table' or vals.err then
      vals = {}
    end
    for i = 1, nr do
      n = n + 1
      out[n] = tonumber(vals[i]) or 0
    end
    a = a + nr
  end
end

for i = 1, nbd do
  local key = KEYS[k + i - 1]
  local period, plus, floor, interval = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  a = a + 4
  n = n + 1
  if fresh then
    local t, iv = bucket(key)
    out[n] = setBucket(key, applyBucket(t, iv, plus, floor, interval, now), interval, period, now, retention, margin)
  else
    local v = redis.pcall('GET', key)
    out[n] = type(v) == 'string' and v or false
  end
end

for i = 1, nwa do
  local w, limit, cursor = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), ARGV[a + 2]
  a = a + 3
  local k = kw[w]
  local hi, ex = cur[w], {cur[w]}
  if not hi or hi == 0 then
    hi, ex = version(KEYS[k + 1]), {}
  end
  n = answer(out, n, KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ttls[w], token, cursor, limit, hi, ex)
end
return out
