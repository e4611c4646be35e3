-- The fuzzers' random numbers: splitmix64 on Lua's wrapping 64-bit integers,
-- so a seed gives the same stream on every platform (and a reproduction
-- line reruns a failure exactly).
return function(seed)
  local s = math.tointeger(seed) or 0
  local r = {}
  function r.u64()
    s = s + 0x9E3779B97F4A7C15
    local z = s
    z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ~ (z >> 27)) * 0x94D049BB133111EB
    return z ~ (z >> 31)
  end
  function r.int(a, b) return a + (r.u64() >> 1) % (b - a + 1) end
  function r.float() return (r.u64() >> 11) * 2.0 ^ -53 end
  function r.chance(p) return r.float() < p end
  function r.pick(list) return list[r.int(1, #list)] end
  return r
end
