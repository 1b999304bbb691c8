-- base.lua: what every script of the Store starts with (each script is
-- made of base.lua, the shared files it needs, versions.lua and/or
-- buckets.lua, and its own file).
--
-- str writes a number with 17 significant digits, so that it reads back bit
-- for bit: Lua's own tostring (and the .. operator) keeps 14. (A number
-- passed to redis.call as such is written exactly by Redis: the scripts
-- pass TTLs and versions that way.)

local function str(n)
  return string.format('%.17g', n)
end

