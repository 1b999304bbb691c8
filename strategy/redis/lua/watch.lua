-- watch.lua answers the watches of one hash tag that a batch does not
-- write: it reads the windows' versions and change logs (and writes only
-- to start a new incarnation of a window that a cursor proves lost
-- versions, see answer).
--
--   KEYS       per window: its hash, its version key, its change log, its
--              markers
--   ARGV[1]    a random incarnation in [1, 2^28]
--   ARGV[2]    the number of windows
--   then per window: its TTL in ms, the watch's limit, its cursor, the
--              number of the batch's own versions of the window and those
--              (ascending): their changes are not listed
--
-- It returns every window's answer (see answer).

watching()
local token, nw = tonumber(ARGV[1]), tonumber(ARGV[2])
local out, n, a = {}, 0, 3
for w = 1, nw do
  local k = 1 + 4 * (w - 1)
  local ttl, limit, cursor, nx = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2], tonumber(ARGV[a + 3])
  local ex = {}
  for i = 1, nx do
    ex[i] = tonumber(ARGV[a + 3 + i])
  end
  a = a + 4 + nx
  n = answer(out, n, KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ttl, token, cursor, limit, version(KEYS[k + 1]), ex)
end
return out
