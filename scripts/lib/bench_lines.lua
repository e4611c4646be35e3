-- The JSON lines of scripts/bench.lua and scripts/bench_torch.py, read back
-- by the scripts that run them (bench_scaling.lua, bench_pairs.lua): flat
-- objects of strings, numbers and booleans, one per line.
local M = {}

--- The fields of one line as a table (empty for a line that is not such an object).
function M.parse(line)
  local t = {}
  for k, v in line:gmatch('"([%w_]+)":%s*("?[^,}]*"?)') do
    if v:sub(1, 1) == '"' then t[k] = v:sub(2, -2)
    elseif v == "true" or v == "false" then t[k] = v == "true"
    else t[k] = tonumber(v) end
  end
  return t
end

return M
