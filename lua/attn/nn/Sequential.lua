--- attn.nn.Sequential(m1, m2, ...): runs its modules in order, each on the
-- previous one's output. The children are named "0", "1", ... as in PyTorch
-- (parameters "0.weight", ...); `seq[1]` is child "0", `#seq` their count.
-- @classmod attn.nn.Sequential
local Module = require "attn.nn.Module"
local caller = require "attn.caller"

local Sequential = Module:extend("Sequential")

function Sequential:init(...)
  local n = select("#", ...)
  for i = 1, n do
    local m = select(i, ...)
    if not Module.is_module(m) then
      local got = type(m) == "table" and getmetatable(m) == nil and "table (pass the modules as arguments, not a list)"
        or type(m)
      caller.error(("attn.nn.Sequential: bad argument #%d (expected an attn.nn module, got %s)"):format(i, got))
    end
    self._children[#self._children + 1] = {name = tostring(i - 1), key = i}
    self[i] = m
  end
end

--- x -> m_n(...(m_2(m_1(x)))); with no modules, x itself. An error names
-- the child it came from ("Sequential:forward: child 2 (Linear): ...").
function Sequential:forward(x)
  for i = 1, #self do
    local m = self[i]
    local ok, y = pcall(m, x)
    if not ok then
      caller.error(("Sequential:forward: child %d (%s): %s"):format(i - 1, getmetatable(m).__name, tostring(y)))
    end
    x = y
  end
  return x
end

return Sequential
