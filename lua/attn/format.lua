--- Printing tensors: a port of PyTorch 1.13's torch/_tensor_str.py.
-- `tostring(t)` / `print(t)` give exactly PyTorch's `str(t)` for a float32
-- or bool tensor (default print options, no grad_fn suffix); `attn.format(t[, opts])`
-- gives the same text with PyTorch's `set_printoptions` fields as options.
-- @module attn.format
local core = require "attn.core"
local caller = require "attn.caller"
local argcheck = require "attn.argcheck"

local floor, ceil, huge = math.floor, math.ceil, math.huge
local sformat, srep, concat = string.format, string.rep, table.concat

local M = {}

--- PyTorch's default print options (torch._tensor_str.PRINT_OPTS).
M.defaults = { precision = 4, threshold = 1000, edgeitems = 3, linewidth = 80, sci_mode = nil }

-- Python's float formatting differs from C's printf only in NaN and infinity:
-- Python never prints a sign on NaN ("nan"), C prints "-nan" for a NaN with
-- its sign bit set (what 0/0 gives on x86).
local function fmt_number(spec, v)
  if v ~= v then return "nan" end
  if v == huge then return "inf" end
  if v == -huge then return "-inf" end
  return sformat(spec, v)
end

-- _Formatter.__init__ over the flat list `vals` (the summarized data when the
-- tensor is summarized, as PyTorch's get_summarized_data).
local function new_formatter(vals, n, opts)
  local f = { int_mode = true, sci_mode = false, max_width = 1 }
  local efmt = "%." .. opts.precision .. "e"
  local ffmt = "%." .. opts.precision .. "f"
  f.efmt, f.ffmt = efmt, ffmt

  -- nonzero finite values, their |min| and |max|
  local nz, k = {}, 0
  local amin, amax = huge, 0
  for i = 1, n do
    local v = vals[i]
    if v == v and v ~= huge and v ~= -huge and v ~= 0 then
      k = k + 1
      nz[k] = v
      local a = v < 0 and -v or v
      if a < amin then amin = a end
      if a > amax then amax = a end
    end
  end

  if k > 0 then
    for i = 1, k do
      local v = nz[i]
      if v ~= ceil(v) then f.int_mode = false; break end
    end
    local w = 1
    if f.int_mode then
      -- integers: "2." style, the decimal point counts in the width
      if amax / amin > 1000.0 or amax > 1.0e8 then
        f.sci_mode = true
        for i = 1, k do
          local l = #sformat(efmt, nz[i]); if l > w then w = l end
        end
      else
        for i = 1, k do
          local l = #sformat("%.0f", nz[i]) + 1; if l > w then w = l end
        end
      end
    else
      if amax / amin > 1000.0 or amax > 1.0e8 or amin < 1.0e-4 then
        f.sci_mode = true
        for i = 1, k do
          local l = #sformat(efmt, nz[i]); if l > w then w = l end
        end
      else
        for i = 1, k do
          local l = #sformat(ffmt, nz[i]); if l > w then w = l end
        end
      end
    end
    f.max_width = w
  end

  -- as PyTorch, the sci_mode option only applies when some value is nonzero
  -- and finite (its _Formatter returns before reading it otherwise)
  if k > 0 and opts.sci_mode ~= nil then f.sci_mode = opts.sci_mode end
  return f
end

-- _Formatter.__init__ of a bool tensor: the width of the longest of str(True)
-- and str(False) among the values.
local function new_bool_formatter(vals, n)
  local f = { is_bool = true, max_width = 4 }
  for i = 1, n do
    if vals[i] == 0 then f.max_width = 5; break end
  end
  return f
end

-- _Formatter.format: one value, right-aligned to the common width.
local function format_value(f, v)
  local s
  if f.is_bool then
    s = v ~= 0 and "True" or "False"
  elseif f.sci_mode then
    s = fmt_number(f.efmt, v)
  elseif f.int_mode then
    s = fmt_number("%.0f", v)
    if v == v and v ~= huge and v ~= -huge then s = s .. "." end
  else
    s = fmt_number(f.ffmt, v)
  end
  local pad = f.max_width - #s
  if pad > 0 then s = srep(" ", pad) .. s end
  return s
end

-- _tensor_str_with_formatter over the flat values of the (summarized) data:
-- `sizes` are the data's sizes, `elided[d]` true where PyTorch puts "..." in
-- dim d (summarizing and the original size > 2 * edgeitems).
local function tensor_str(st, d, indent)
  local sizes, ndim = st.sizes, st.ndim
  local n = sizes[d]
  local edge = st.opts.edgeitems
  if d == ndim then
    -- _vector_str
    local f = st.f
    local element_length = f.max_width + 2
    local per_line = floor((st.opts.linewidth - indent) / element_length)
    if per_line < 1 then per_line = 1 end
    local data, k = {}, 0
    local vals, pos = st.vals, st.pos
    for i = 1, n do
      k = k + 1
      data[k] = format_value(f, vals[pos + i])
      if st.elided[d] and i == edge then k = k + 1; data[k] = " ..." end
    end
    st.pos = pos + n
    local lines = {}
    for i = 1, k, per_line do
      lines[#lines + 1] = concat(data, ", ", i, math.min(i + per_line - 1, k))
    end
    return "[" .. concat(lines, ",\n" .. srep(" ", indent + 1)) .. "]"
  end
  local slices = {}
  for i = 1, n do
    slices[#slices + 1] = tensor_str(st, d + 1, indent + 1)
    if st.elided[d] and i == edge then slices[#slices + 1] = "..." end
  end
  return "[" .. concat(slices, "," .. srep("\n", ndim - d) .. srep(" ", indent + 1)) .. "]"
end

-- Python's str() of a shape tuple.
local function tuple_str(sizes)
  if #sizes == 1 then return "(" .. sizes[1] .. ",)" end
  return "(" .. concat(sizes, ", ") .. ")"
end

local opt_types = { precision = "integer", threshold = "number", edgeitems = "integer",
                    linewidth = "integer", sci_mode = "boolean", profile = "string" }

-- torch.set_printoptions' profiles: what each sets before the explicit fields.
local profiles = {
  default = { precision = 4, threshold = 1000, edgeitems = 3, linewidth = 80 },
  short = { precision = 2, threshold = 1000, edgeitems = 2, linewidth = 80 },
  full = { precision = 4, threshold = huge, edgeitems = 3, linewidth = 80 },
}

-- Validated options over `base`: `opts`' profile first, then its fields.
local function merge_opts(fname, argn, opts, base)
  local o = {}
  for k, v in pairs(base) do o[k] = v end
  if opts == nil then return o end
  if type(opts) ~= "table" then
    caller.error(fname .. ": bad argument #" .. argn .. " 'opts' (expected a table, got "
      .. type(opts) .. ")")
  end
  for k, v in pairs(opts) do
    local want = opt_types[k]
    if want == nil then
      caller.error(fname .. ": bad argument #" .. argn .. " 'opts' (unknown option '"
        .. tostring(k) .. "'; expected precision, threshold, edgeitems, linewidth, sci_mode or profile)")
    end
    local ok
    if want == "integer" then ok = math.type(v) == "integer" or (type(v) == "number" and v == floor(v))
    elseif want == "number" then ok = type(v) == "number" and v == v
    elseif want == "string" then ok = profiles[v] ~= nil
    else ok = type(v) == "boolean" end
    if not ok then
      caller.error(fname .. ": bad option '" .. k .. "' (expected " .. (want == "integer" and "an integer" or
        want == "number" and "a number" or want == "string" and "'default', 'short' or 'full'" or "a boolean")
        .. ", got " .. tostring(v) .. ")")
    end
    if k == "precision" and v < 0 or (k == "edgeitems" or k == "linewidth") and v < 1 then
      caller.error(fname .. ": bad option '" .. k .. "' (expected " .. (k == "precision" and ">= 0" or ">= 1")
        .. ", got " .. tostring(v) .. ")")
    end
  end
  if opts.profile then
    for k, v in pairs(profiles[opts.profile]) do o[k] = v end
  end
  for k, v in pairs(opts) do
    if opt_types[k] == "integer" then o[k] = floor(v)
    elseif k ~= "profile" then o[k] = v end
  end
  if o.precision > 50 then
    caller.error(fname .. ": bad option 'precision' (expected <= 50, got " .. o.precision .. ")")
  end
  return o
end

local function check_opts(opts)
  return merge_opts("attn.format", 2, opts, M.defaults)
end

-- Set the print options (attn.set_printoptions, documented in init.lua) every later `tostring(t)` uses, as
-- `torch.set_printoptions`: any of `precision`, `threshold`, `edgeitems`,
-- `linewidth`, `sci_mode` and `profile` ("default", "short", "full"; applied
-- first, then the other fields). As in PyTorch, `sci_mode` is always set:
-- leaving it out goes back to automatic.
-- @param opts table
function M.set_printoptions(opts)
  if opts == nil then
    caller.error("attn.set_printoptions: bad argument #1 'opts' (expected a table, got no value)")
  end
  local o = merge_opts("attn.set_printoptions", 1, opts, M.defaults)
  o.sci_mode = opts.sci_mode
  M.defaults = o
end

-- The copies get_printoptions returns print readably (in the REPL too) and
-- stay plain tables otherwise: fields, pairs, set_printoptions(o).
local PRINTOPTIONS_ORDER = { "precision", "threshold", "edgeitems", "linewidth", "sci_mode" }
local printoptions_mt = {
  __name = "attn.printoptions",
  __tostring = function(o)
    local parts = {}
    for _, k in ipairs(PRINTOPTIONS_ORDER) do
      local v = rawget(o, k)
      local text
      if v == nil then text = k == "sci_mode" and "nil (automatic)" or "nil"
      elseif v == huge then text = "math.huge"
      else text = tostring(v) end
      parts[#parts + 1] = k .. " = " .. text
    end
    return "{" .. concat(parts, ", ") .. "}"
  end,
}

-- A copy of the current print options (the fields `set_printoptions` takes).
-- It prints as `{precision = 4, threshold = 1000, edgeitems = 3, linewidth = 80, sci_mode = nil (automatic)}`.
-- @return table
function M.get_printoptions()
  local o = {}
  for k, v in pairs(M.defaults) do o[k] = v end
  return setmetatable(o, printoptions_mt)
end

-- The data PyTorch formats: each dim longer than 2 * edgeitems cut down to
-- its first and last edgeitems when summarizing (get_summarized_data).
local function summarized(t, sizes, edge, elided)
  for d = 1, #sizes do
    local n = sizes[d]
    if n > 2 * edge then
      elided[d] = true
      t = core.cat({ t:narrow(d, 1, edge), t:narrow(d, n - edge + 1, edge) }, d)
    end
  end
  return t
end

local function body(t, opts, indent)
  local sizes = t:size()
  local ndim = #sizes
  local numel = t:numel()
  local is_bool = t.dtype == "bool"
  if ndim == 0 then
    local v = t:item()
    local f = is_bool and new_bool_formatter({ v }, 1) or new_formatter({ v }, 1, opts)
    return format_value(f, v)
  end
  local summarize = numel > opts.threshold
  local elided = {}
  local data = t
  if summarize then data = summarized(t, sizes, opts.edgeitems, elided) end
  local dsizes = data:size()
  local vals
  if data:numel() == 0 then vals = {} else vals = data:contiguous():view(-1):totable() end
  local st = {
    sizes = dsizes, ndim = ndim, elided = elided, opts = opts,
    f = is_bool and new_bool_formatter(vals, #vals) or new_formatter(vals, #vals, opts), vals = vals, pos = 0,
  }
  return tensor_str(st, 1, indent)
end

--- The text of `t` as PyTorch prints it (`str(t)`).
-- @param t tensor
-- @param[opt] opts table with any of PyTorch's print options: `precision` (4),
--   `threshold` (1000), `edgeitems` (3), `linewidth` (80), `sci_mode` (nil: automatic)
-- @return string
function M.format(t, opts)
  argcheck.check_tensor("attn.format", t, 1, "t", type)
  local o = check_opts(opts)
  local prefix = "tensor("
  local indent = #prefix
  local s
  local suffixes = {}
  if t:numel() == 0 then
    s = prefix .. "[]"
    local sizes = t:size()
    if #sizes ~= 1 then suffixes[1] = "size=" .. tuple_str(sizes) end
    -- an empty tensor names its dtype unless it is the default one
    if t.dtype == "bool" then suffixes[#suffixes + 1] = "dtype=torch.bool" end
  else
    s = prefix .. body(t, o, indent)
  end
  local extra = M.suffixes and M.suffixes(t)
  if extra then for _, x in ipairs(extra) do suffixes[#suffixes + 1] = x end end
  -- torch's _add_suffixes: each suffix after ", " or, past the line width, on a new indented line
  local nl = s:match(".*()\n")
  local last_line_len = nl and #s - nl + 2 or #s + 2
  for _, suffix in ipairs(suffixes) do
    if last_line_len + #suffix + 2 > o.linewidth then
      s = s .. ",\n" .. srep(" ", indent) .. suffix
      last_line_len = indent + #suffix
    else
      s = s .. ", " .. suffix
      last_line_len = last_line_len + #suffix + 2
    end
  end
  return s .. ")"
end

return M
