-- buckets.lua: token-bucket states.

-- Token buckets: a string key per bucket, "<tat> <interval>", each written
-- with 17 significant digits so that it reads back bit for bit.

-- Defined only for a script call that has buckets (Redis runs a script's
-- definitions at every call): bucketing() defines them.
local bucket, convertTAT, applyBucket, setBucket
local function bucketing()
  -- bucket returns a bucket key's TAT and interval, or nil when it holds no
  -- state (or something that is not one).
  bucket = function(key)
    local v = redis.pcall('GET', key)
    if type(v) ~= 'string' then
      return nil
    end
    local t, i = string.match(v, '^(%S+) (%S+)$')
    t, i = tonumber(t), tonumber(i)
    if not t or not i or t ~= t or not (i > 0) then
      return nil
    end
    return t, i
  end

  -- convertTAT is strategy.ConvertTAT: tat, kept at interval from, as the TAT
  -- at interval to at now, evaluated in Go's order.
  convertTAT = function(tat, from, to, now)
    if tat <= now or from <= 0 or from == to then
      return tat
    end
    return now + (tat - now) * to / from
  end

  -- applyBucket is strategy.ApplyBucket: the TAT a bucket holding (t, i) (t
  -- nil: no state, full since before the spends) has once (add, floor) at
  -- interval is applied at now, tat -> max(ConvertTAT(tat) + add, floor).
  applyBucket = function(t, i, add, floor, interval, now)
    if not t then
      return floor
    end
    return math.max(convertTAT(t, i, interval, now) + add, floor)
  end

  -- setBucket writes a bucket's state, kept until strategy.BucketExpiry plus
  -- margin (forgotten at once when that is past), and returns its encoding.
  setBucket = function(key, tat, interval, period, now, retention, margin)
    local s = string.format('%.17g %.17g', tat, interval)
    local ttl = math.ceil(tat) + period + retention - now + margin
    if ttl >= 1 then
      redis.call('SET', key, s, 'PX', ttl)
    else
      redis.call('DEL', key)
    end
    return s
  end
end
