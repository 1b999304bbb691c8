-- versions.lua: the versions and change logs of windows (watches).

-- Versions. A window of one shard (one hash) that has been watched has a
-- version key holding a whole number incarnation * INC + count: count goes
-- up by one for each batch part that changes the window, and the
-- incarnation is drawn at random (by the client) whenever the version key
-- is (re)created, so that a cursor of a lost history (an expired window, a
-- Redis restarted without persistence, FLUSHALL) never matches the new one.
-- The change log is a sorted set holding each field changed since the
-- window was first watched once, scored with the version of its last
-- change; the markers (see mark) stand for the changes it does not list.
-- A window nobody has watched has no version key, and its writes log
-- nothing: the first watch creates the version key (with a marker: the log
-- cannot tell what changed before).
local INC = 16777216 -- 2^24
local MAXV = 9007199254740992 -- 2^53: versions stay exact in a double

-- version returns the window's current version, 0 when it has none (or
-- holds something that is not one).
local function version(meta)
  local v = redis.pcall('GET', meta)
  if type(v) ~= 'string' then
    return 0
  end
  v = tonumber(v)
  if not v or v <= INC or v >= MAXV or v % 1 ~= 0 then
    return 0
  end
  return v
end

-- zadd adds z (score, member pairs) to the log, replacing a key of another
-- type rather than failing after earlier writes.
local function zadd(log, z)
  local r = redis.pcall('ZADD', log, unpack(z))
  if type(r) == 'table' and r.err then
    redis.call('DEL', log)
    redis.call('ZADD', log, unpack(z))
  end
end

-- expire gives a window's keys the same TTL, so that they expire together:
-- a version key never outlives the counters it describes.
local function expire(hash, meta, log, marks, ttl)
  redis.call('PEXPIRE', hash, ttl)
  redis.call('PEXPIRE', meta, ttl)
  redis.call('PEXPIRE', log, ttl)
  redis.call('PEXPIRE', marks, ttl)
end

-- Markers. A batch that changes at least half of a window's fields in a
-- shard (and at least MINMARK) does not log them one by one, which would
-- cost Redis about as much as the increments themselves: each of its parts
-- adds its version to the window's markers (a sorted set of versions),
-- which tell watches that anything may have changed at that version. The
-- set keeps at least the KEEPMARKS latest (at most twice as many); its
-- member 't' is scored with the latest version trimmed.
local MINMARK, KEEPMARKS = 64, 32

-- mark records marker v, with the hash's TTL. Under high churn every part
-- of a pass marks, so the set is trimmed back to the KEEPMARKS latest only
-- once it holds twice as many (one trim per KEEPMARKS markers, not one per
-- marker), and it gets the hash's TTL only when this marker created it: a
-- set that already existed got that TTL with it (incarnate, or here), and
-- every later change of the hash's TTL sets the set's too (expire).
local function mark(hash, marks, v, ttl)
  zadd(marks, {v, str(v)})
  local n = redis.call('ZCARD', marks)
  if n > 2 * KEEPMARKS + 1 then
    local old = redis.call('ZRANGE', marks, 0, n - KEEPMARKS - 1, 'WITHSCORES')
    local top = 0
    for i = 2, #old, 2 do
      top = math.max(top, tonumber(old[i]))
    end
    redis.call('ZREMRANGEBYRANK', marks, 0, n - KEEPMARKS - 1)
    redis.call('ZADD', marks, top, 't')
  end
  if n == 1 then
    local pttl = redis.call('PTTL', hash)
    if pttl > 0 then
      ttl = pttl
    end
    redis.call('PEXPIRE', marks, ttl)
  end
end

-- The functions of watches, defined only for a script call that answers
-- watches (Redis runs a script's definitions at every call): watching()
-- defines incarnate, listAll and answer.
local incarnate, listAll, answer
local function watching()
  -- incarnate starts a fresh incarnation of a window at version token * INC +
  -- 1, with a marker at it: the log lists nothing of the window's history
  -- before. The caller sets the TTLs.
  incarnate = function(meta, log, marks, token)
    local v = token * INC + 1
    redis.call('SET', meta, v)
    redis.call('DEL', log, marks)
    -- The log exists from now on (a member '' scored 0, below every
    -- cursor), so that the caller gives it its TTL: the writes that log
    -- later may create no field, and set no TTL.
    redis.call('ZADD', log, 0, '')
    zadd(marks, {v, str(v)})
    return v
  end

  -- listAll appends to out (holding n values) an answer listing every counter
  -- the hash holds (status 4), or status 1 when they are more than limit.
  listAll = function(out, n, hash, limit, version)
    local len = redis.pcall('HLEN', hash)
    if type(len) ~= 'number' then
      len = 0
    end
    if len > limit then
      out[n + 1], out[n + 2], out[n + 3] = 1, version, len
      return n + 3
    end
    out[n + 1], out[n + 2], out[n + 3] = 4, version, len
    n = n + 3
    if len > 0 then
      local all = redis.call('HGETALL', hash)
      for i = 1, #all do
        out[n + i] = all[i]
      end
      n = n + #all
    end
    return n
  end

  -- answer appends to out (holding n values) the answer to a watch of a
  -- window (hash, meta, log, marks): a status, the window's version (hi, or
  -- the part's own version for status 3), a count, and for status 0 and 4
  -- count (field, total) pairs. Status 0 lists the changes after the cursor
  -- and up to hi, except those of the batch's own versions ex (ascending),
  -- whose counters the client lists from their totals; 4 lists every counter
  -- the window holds (the log cannot tell what changed: the window was not
  -- watched before, or another batch marked a version since the cursor); 1:
  -- more than limit to list; 2: the cursor is not one of this window's; 3:
  -- the part's own version only, for cursor '='. cursor is '' (from the
  -- start), 'x' (unusable), '=' or a version. It returns the new n.
  answer = function(out, n, hash, meta, log, marks, ttl, token, cursor, limit, hi, ex)
    if cursor == '=' then
      out[n + 1], out[n + 2], out[n + 3] = 3, ex[1] or 0, 0
      return n + 3
    end
    local function start()
      -- A new incarnation, with the hash's TTL (or the window's).
      local v = incarnate(meta, log, marks, token)
      local pttl = redis.call('PTTL', hash)
      if pttl > 0 then
        ttl = pttl
      end
      expire(hash, meta, log, marks, ttl)
      return v
    end
    if hi == 0 then
      -- Never watched, or its version key was lost: its changes are logged
      -- from now on. A watch from the start lists what it holds; any other
      -- cursor is of a lost incarnation.
      hi = start()
      if cursor == '' then
        return listAll(out, n, hash, limit, hi)
      end
      out[n + 1], out[n + 2], out[n + 3] = 2, hi, 0
      return n + 3
    end
    local lo = '-inf'
    if cursor ~= '' then
      local c = tonumber(cursor)
      if not c or math.floor(c / INC) ~= math.floor(hi / INC) then
        out[n + 1], out[n + 2], out[n + 3] = 2, hi, 0
        return n + 3
      end
      local ahead = c > hi
      for _, e in ipairs(ex) do
        ahead = ahead or c == e
      end
      if ahead then
        -- A position this window never reached (or reached after the cursor
        -- was answered): Redis lost versions it had answered (a failover to
        -- a replica that lagged). Every cursor of this incarnation is
        -- suspect: start a new one.
        out[n + 1], out[n + 2], out[n + 3] = 2, start(), 0
        return n + 3
      end
      if c == hi then
        out[n + 1], out[n + 2], out[n + 3] = 0, hi, 0
        return n + 3
      end
      lo = '(' .. str(c)
    end
    local ms = redis.pcall('ZRANGEBYSCORE', marks, lo, hi)
    if type(ms) == 'table' and not ms.err then
      for _, m in ipairs(ms) do
        local own = false
        for _, e in ipairs(ex) do
          own = own or tonumber(m) == e
        end
        if not own then -- another batch's marker, or one trimmed ('t')
          return listAll(out, n, hash, limit, hi)
        end
      end
    end
    -- The ranges between the cursor, the own versions and hi.
    local ranges = {}
    for _, e in ipairs(ex) do
      ranges[#ranges + 1] = {lo, '(' .. str(e)}
      lo = '(' .. str(e)
    end
    if ex[#ex] ~= hi then
      ranges[#ranges + 1] = {lo, hi}
    end
    local count = 0
    for _, r in ipairs(ranges) do
      local c = redis.pcall('ZCOUNT', log, r[1], r[2])
      if type(c) == 'number' then
        count = count + c
      end
    end
    if count > limit then
      out[n + 1], out[n + 2], out[n + 3] = 1, hi, count
      return n + 3
    end
    out[n + 1], out[n + 2], out[n + 3] = 0, hi, count
    n = n + 3
    if count == 0 then
      return n
    end
    -- ZCOUNT and ZRANGEBYSCORE see the same log: count fields follow.
    for _, r in ipairs(ranges) do
      local fields = redis.call('ZRANGEBYSCORE', log, r[1], r[2])
      for i = 1, #fields, 1000 do
        local j = math.min(i + 999, #fields)
        local vals = redis.pcall('HMGET', hash, unpack(fields, i, j))
        if type(vals) ~= 'table' or vals.err then
          vals = {}
        end
        for k = i, j do
          out[n + 1], out[n + 2] = fields[k], vals[k - i + 1] or false
          n = n + 2
        end
      end
    end
    return n
  end
end
