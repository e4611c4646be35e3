--- attn: a Lua-scriptable attention engine.
-- `require "attn"` returns this module table: tensors, maths, attention and
-- the `nn` classes. The C core lives in `attn.core`; this file gathers it and
-- the Lua layer into one table.
-- @module attn
local core = require "attn.core"
-- errors raised below the user's call point at the user's line (C and Lua alike)
local caller = require "attn.caller"
local argcheck = require "attn.argcheck"

local attn = {}
for name, fn in pairs(core) do
  if type(fn) == "function" then attn[name] = fn end
end

--- Methods of every tensor (`t:name(...)`); Lua files of the layer add to it.
attn.Tensor = core.Tensor
-- Block-sparse masks: `attn.block_mask(fn, B, H, Lq, Lk[, {block}])` and its built-ins (src/binding/lua_block_mask.c).
attn.block_mask = core.block_mask
local Tensor, mt = core.Tensor, core.Tensor_mt

--- True when `x` is an attn tensor.
-- @function is_tensor
attn.is_tensor = argcheck.is_tensor

local check_nargs = argcheck.check_nargs

local function check_tensor(x, fname, argn, what)
  argcheck.check_tensor(fname, x, argn, what)
end

--- A zero tensor of `t`'s shape.
function attn.zeros_like(...)
  local t = ...
  check_nargs("attn.zeros_like", 1, select("#", ...))
  check_tensor(t, "attn.zeros_like", 1, "t")
  return attn.zeros(t:size())
end
--- A tensor of ones of `t`'s shape.
function attn.ones_like(...)
  local t = ...
  check_nargs("attn.ones_like", 1, select("#", ...))
  check_tensor(t, "attn.ones_like", 1, "t")
  return attn.ones(t:size())
end

--- `|a - b| <= atol + rtol * |b|` everywhere (broadcasting), NaN never close.
-- @param a tensor
-- @param b tensor
-- @param[opt=1e-5] rtol
-- @param[opt=1e-8] atol
function attn.allclose(...)
  local a, b, rtol, atol = ...
  check_nargs("attn.allclose", 4, select("#", ...))
  if not attn.is_tensor(a) then caller.error("attn.allclose: bad argument #1 'a' (expected attn.Tensor, got " .. type(a) .. ")") end
  if not attn.is_tensor(b) then caller.error("attn.allclose: bad argument #2 'b' (expected attn.Tensor, got " .. type(b) .. ")") end
  rtol, atol = rtol or 1e-5, atol or 1e-8
  if type(rtol) ~= "number" then caller.error("attn.allclose: bad argument #3 'rtol' (expected a number, got " .. type(rtol) .. ")") end
  if type(atol) ~= "number" then caller.error("attn.allclose: bad argument #4 'atol' (expected a number, got " .. type(atol) .. ")") end
  local okd, diff = pcall(attn.sub, a, b)
  if not okd then -- the real cause (shapes that do not broadcast, out of memory), under allclose's name
    caller.error("attn.allclose: " .. tostring(diff):gsub("^.-attn%.sub: ", ""))
  end
  -- as torch.isclose: equal values (infinities included) are close, else a
  -- finite |a - b| within atol + rtol * |b|
  local err = diff:abs()
  local ok = err:le(b:abs() * rtol + atol):mul_(err:lt(math.huge)):add_(a:eq(b)):bool()
  if ok:numel() == 0 then return true end
  return ok:min():item() == 1
end
Tensor.allclose = attn.allclose

--- `t` as float32: a bool tensor's 0 and 1 in a new float tensor, as
-- `t.float()` in PyTorch; a float tensor is returned itself. `t.dtype` says
-- which a tensor is: "float32" or "bool" (comparisons, `t:bool()`, the
-- logical ops and bool file data make bool tensors, PyTorch's torch.bool).
function Tensor.float(...)
  local t = ...
  check_nargs("Tensor:float", 1, select("#", ...))
  check_tensor(t, "Tensor:float", 1, "self")
  if t.dtype == "bool" then return core.mul(t, 1) end -- a number operand makes the product float
  return t
end
-- Run t:method(other:size()), its error re-raised under `fname` (what the user called).
local function as_shape_of(fname, method, t, other)
  check_tensor(t, fname, 1, "self")
  check_tensor(other, fname, 2, "other")
  local ok, res = pcall(Tensor[method], t, other:size())
  if not ok then
    caller.error(fname .. ": " .. tostring(res):gsub("^.-Tensor:" .. method .. ": ", ""))
  end
  return res
end

--- A view of `t` with `other`'s shape.
function Tensor.view_as(t, other) return as_shape_of("Tensor:view_as", "view", t, other) end
--- `t` expanded to `other`'s shape.
function Tensor.expand_as(t, other) return as_shape_of("Tensor:expand_as", "expand", t, other) end

local autograd = require "attn.autograd"
--- Reverse-mode autograd: `attn.autograd.grad(outputs, inputs[, grad_outputs[, {retain_graph, allow_unused}]])`,
-- `attn.autograd.Function{name, forward, backward}` for a differentiable function of your own.
attn.autograd = autograd
-- every recorded op in place of its raw C function (the index of which file holds which formula is there)
require("attn.autograd.formulas").install(attn)
-- attn.score_mod / attn.mask_mod, and the traced forms of attn.where and t[traced]
require("attn.score_mod").install(attn, autograd)
--- Run fn(...) with recording off and return its results (torch.no_grad).
attn.no_grad = autograd.no_grad
--- Run fn(...) with recording on (torch.enable_grad).
attn.enable_grad = autograd.enable_grad
--- Turn autograd recording on or off in the running coroutine; returns the previous setting.
attn.set_grad_enabled = autograd.set_grad_enabled
--- Whether autograd records.
attn.is_grad_enabled = autograd.is_grad_enabled
--- Accumulate the gradient of t into the leaves' `.grad`: `t:backward([gradient][, {retain_graph}])`.
Tensor.backward = autograd.backward
--- Mark a leaf as requiring grad (default true); returns it.
Tensor.requires_grad_ = autograd.requires_grad_
--- A tensor over the same elements without autograd history.
Tensor.detach = autograd.detach

-- creation functions take a trailing {requires_grad = true}
local function with_creation_opts(fname, create)
  return function(...)
    local n = select("#", ...)
    local last = select(n > 0 and n or 1, ...)
    if n >= 1 and type(last) == "table" and getmetatable(last) == nil and next(last) ~= nil and rawget(last, 1) == nil then
      for k in pairs(last) do
        if k ~= "requires_grad" then
          caller.error(("%s: bad argument #%d 'opts' (unknown option '%s'; expected requires_grad)"):format(fname, n,
            tostring(k)))
        end
      end
      local rg = last.requires_grad
      if rg ~= nil and type(rg) ~= "boolean" then
        caller.error(("%s: bad argument #%d 'opts' (requires_grad must be a boolean, got %s)"):format(fname, n, type(rg)))
      end
      local t = create(table.unpack({ ... }, 1, n - 1))
      if rg then autograd.requires_grad_(t, true) end
      return t
    end
    return create(...)
  end
end
for _, name in ipairs{ "tensor", "zeros", "ones", "empty", "full", "eye", "arange", "rand", "randn" } do
  attn[name] = with_creation_opts("attn." .. name, attn[name])
end

local format = require "attn.format"
format.suffixes = autograd.print_suffixes
--- PyTorch's print of a tensor: `attn.format(t[, opts])`, `tostring(t)`.
attn.format = format.format
--- Set the print options every later `tostring(t)` uses, as
-- `torch.set_printoptions`: a table with any of `precision` (4), `threshold`
-- (1000), `edgeitems` (3), `linewidth` (80), `sci_mode` (nil: automatic) and
-- `profile` ("default", "short" or "full", applied before the other fields).
-- As in PyTorch, leaving `sci_mode` out sets it back to automatic.
-- @param opts table
attn.set_printoptions = format.set_printoptions
--- A copy of the current print options (the fields `set_printoptions` takes),
-- a plain table that prints readably: `{precision = 4, threshold = 1000, ...}`.
-- @return table
attn.get_printoptions = format.get_printoptions
mt.__tostring = function(t)
  check_tensor(t, "attn.Tensor tostring", 1, "self")
  if autograd.is_parameter(t) then return "Parameter containing:\n" .. format.format(t) end
  return format.format(t)
end

-- The nn files `require "attn"`: publish the table first so that require finds it.
package.loaded["attn"] = attn
--- The nn module classes (attn.nn.Linear, attn.nn.Dropout, ...).
attn.nn = require "attn.nn"
--- The optimizers (attn.optim.SGD, Adam, AdamW).
attn.optim = require "attn.optim"
--- Attention heatmaps (SVG and terminal): see `attn.viz`.
attn.viz = require "attn.viz"
--- Text to token ids: `attn.tokenizer.gpt2([dir])` (GPT-2's BPE, tiktoken's ids + 1).
attn.tokenizer = require "attn.tokenizer"
--- A random generator of its own, as `torch.Generator()`: `attn.Generator():manual_seed(s)`.
attn.Generator = require("attn.generator").new
--- Token windows and batches as the book's chapter 2: `attn.data.GPTDataset`, `attn.data.DataLoader`.
attn.data = require "attn.data"
--- Prints the doc of a public function or class:
-- `attn.help(attn.matmul)`, `attn.help("nn.Linear")`, `attn.help("transpose")` (a
-- tensor method by its short name); a class or module also lists its methods,
-- a tensor lists the tensor methods; an unknown name prints close names.
-- `attn.help()` lists the topics.
-- @param[opt] what a public function or class, a module, a tensor, or a name
function attn.help(...) return require("attn.tools.help").help(...) end
--- A progress line on stderr (count, rate, ETA) when stderr is a terminal:
-- `local p = attn.progress(total, label)`, `p:step()`, `p:done()`.
-- @param total the number of steps
-- @param[opt] label text in front of the count
function attn.progress(...) return require("attn.tools.progress").new(...) end
--- Text generation with a GPTModel, as the book's generate (greedy, temperature,
-- top-k; through the KV cache by default): see `attn.generate` in lua/attn/generate.lua.
-- @param model an attn.nn.GPTModel
-- @param idx [batch, tokens] 1-based token ids
-- @param max_new_tokens how many tokens to append
-- @param[opt] opts {temperature = 0, top_k = nil, use_cache = true}
-- @return idx [batch, tokens + max_new_tokens]
function attn.generate(...) return require("attn.generate")(...) end

return attn
