-- The JSON lines of scripts/bench.lua, bench_dist.lua and bench_torch.py,
-- written by the Lua ones and read back by the scripts that run them
-- (bench_scaling.lua, bench_pairs.lua): flat objects of strings, numbers and
-- booleans, one per line.
local M = {}

--- The fields of one line as a table (empty for a line that is not such an object).
function M.parse(line)
  local t = {}
  -- strings (commas allowed inside: "scalar,avx2,avx512"), then numbers and booleans
  for k, v in line:gmatch('"([%w_]+)":%s*"([^"]*)"') do t[k] = v end
  for k, v in line:gmatch('"([%w_]+)":%s*([^"%s,}][^,}]*)') do
    if v == "true" or v == "false" then t[k] = v == "true"
    else t[k] = tonumber(v) end
  end
  return t
end

--- One object as a line: the keys named in first (a list) in that order, then
-- the others by name; strings quoted, integers and booleans as they are,
-- other numbers to 4 significant digits.
function M.format(t, first)
  local rank = {}
  for i, k in ipairs(first) do rank[k] = i end
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b)
    local ra, rb = rank[a] or math.huge, rank[b] or math.huge
    if ra ~= rb then return ra < rb end
    return a < b
  end)
  local parts = {}
  for _, k in ipairs(keys) do
    local v = t[k]
    local s
    if type(v) == "string" then s = ("%q"):format(v)
    elseif type(v) == "boolean" or math.type(v) == "integer" then s = tostring(v)
    else s = ("%.4g"):format(v) end
    parts[#parts + 1] = ("%q: %s"):format(k, s)
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

return M
