--- attn.nn.Linear(in_features, out_features[, {bias = true}]): y = x W^T + b.
-- Parameters, in creation order: `weight` [out, in], `bias` [out]. They are
-- drawn exactly as torch.nn.Linear does (kaiming_uniform_(a = sqrt(5)) on the
-- weight, then U(-1/sqrt(in), 1/sqrt(in)) on the bias), so after the same
-- attn.manual_seed the weights are the same bits as PyTorch's.
-- @classmod attn.nn.Linear
local attn = require "attn"
local caller = require "attn.caller"
local linear = require("attn.autograd.linear").linear
local Module = require "attn.nn.Module"

local Linear = Module:extend("Linear")

local function check_width(v, what, argn)
  if math.type(v) ~= "integer" and not (type(v) == "number" and v == math.floor(v) and v == v) then
    caller.error(("attn.nn.Linear: bad argument #%d '%s' (expected a positive integer, got %s)"):format(
      argn, what, type(v) == "number" and tostring(v) or type(v)))
  end
  v = math.tointeger(v)
  if not v or v < 1 then
    caller.error(("attn.nn.Linear: bad argument #%d '%s' (expected a positive integer, got %s)"):format(
      argn, what, tostring(v)))
  end
  return v
end

function Linear:init(in_features, out_features, opts)
  in_features = check_width(in_features, "in_features", 1)
  out_features = check_width(out_features, "out_features", 2)
  local bias = true
  if opts ~= nil then
    if type(opts) ~= "table" then
      caller.error("attn.nn.Linear: bad argument #3 'opts' (expected a table such as {bias = false}, got "
            .. type(opts) .. ")")
    end
    if opts.bias ~= nil then
      if type(opts.bias) ~= "boolean" then
        caller.error("attn.nn.Linear: bad option 'bias' (expected boolean, got " .. type(opts.bias) .. ")")
      end
      bias = opts.bias
    end
  end
  self.in_features, self.out_features = in_features, out_features
  -- torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5)), in doubles as Python computes it
  local a = math.sqrt(5.0)
  local gain = math.sqrt(2.0 / (1 + a ^ 2))
  local std = gain / math.sqrt(in_features)
  local bound = math.sqrt(3.0) * std
  self:add_parameter("weight", attn.empty(out_features, in_features):uniform_(-bound, bound))
  if bias then
    local b = 1 / math.sqrt(in_features)
    self:add_parameter("bias", attn.empty(out_features):uniform_(-b, b))
  end
end

--- x [..., in_features] -> [..., out_features].
function Linear:forward(x)
  if not attn.is_tensor(x) then
    caller.error("Linear:forward: bad argument #1 'input' (expected attn.Tensor, got " .. type(x) .. ")")
  end
  local n = x:dim()
  if n == 0 or x:size(n) ~= self.in_features then
    caller.error(("Linear:forward: input of shape [%s] does not end in in_features = %d"):format(
      table.concat(x:size(), ", "), self.in_features))
  end
  return linear(x, self.weight, self.bias)
end

function Linear:extra_repr()
  return ("in_features=%d, out_features=%d, bias=%s"):format(self.in_features, self.out_features,
    self.bias ~= nil and "True" or "False")
end

return Linear
